import torch

from fsd.engine.output import JobFault
from fsd.engine.sampler import Sampler
from fsd.jobs import MAX_TEMPERATURE, SamplingParams


def logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax_and_banned_tokens_are_skipped():
    s = Sampler(0, torch.device("cpu"))
    x = logits(3)
    params = [SamplingParams()] * 3
    assert s.sample(x.clone(), params, ["a", "b", "c"]) == x.argmax(-1).tolist()
    top = int(x[0].argmax())
    banned = s.sample(x.clone(), params, ["a", "b", "c"], banned=[(top,), (), ()])
    assert banned[0] != top and banned[0] == int(x[0].topk(2).indices[1])


def test_top_k_one_and_tiny_top_p_are_greedy():
    s = Sampler(0, torch.device("cpu"))
    x = logits(4)
    params = [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)]
    for _ in range(5):
        assert s.sample(x[:2].clone(), params, ["a", "b"]) == x[:2].argmax(-1).tolist()


def test_top_k_keeps_draws_inside_the_k_best():
    s = Sampler(1, torch.device("cpu"))
    x = logits(1, vocab=100)
    allowed = set(x[0].topk(3).indices.tolist())
    p = [SamplingParams(temperature=MAX_TEMPERATURE, top_k=3)]
    draws = {s.sample(x.clone(), p, ["a"])[0] for _ in range(200)}
    assert draws <= allowed and len(draws) > 1


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    s = Sampler(1, torch.device("cpu"))
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = [SamplingParams(temperature=1.0, top_p=0.7)]
    draws = {s.sample(x.clone(), p, ["a"])[0] for _ in range(300)}
    assert draws == {0, 1}


def test_a_seeded_job_draws_the_same_whatever_shares_its_batch():
    x = logits(4, seed=3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(0, torch.device("cpu"))
    a = [alone.sample(x[:1].clone(), [seeded], ["j"])[0] for _ in range(10)]
    mixed = Sampler(7, torch.device("cpu"))
    other = SamplingParams(temperature=1.0)
    b = [
        mixed.sample(x.clone(), [other, seeded, other, other], ["o1", "j", "o2", "o3"])[1]
        for _ in range(10)
    ]
    # row 1 of x differs from row 0, so compare against the same row alone
    alone2 = Sampler(0, torch.device("cpu"))
    c = [alone2.sample(x[1:2].clone(), [seeded], ["j"])[0] for _ in range(10)]
    assert b == c
    assert len(set(a)) > 1


NAN, INF = float("nan"), float("inf")


def test_rows_that_are_not_distributions_take_the_argmax_of_the_usable_logits():
    s = Sampler(0, torch.device("cpu"))
    x = torch.tensor(
        [
            [0.5, NAN, 2.0, 1.0],  # NaN never wins
            [NAN, NAN, NAN, NAN],  # nothing usable: token 0
            [1.0, 3.0, INF, 0.0],  # an overflowed logit wins
            [1.0, 2.0, 3.0, 4.0],  # every token banned: token 0
            [3.0e38, -3.0e38, 1.0, 2.0],  # overflows at a low temperature
        ]
    )
    ban = [(), (), (), (0, 1, 2, 3), ()]
    for temperature in (0.0, 1e-5, 1.0, MAX_TEMPERATURE):
        params = [SamplingParams(temperature=temperature, top_p=0.9, top_k=3)] * 5
        ids = [f"j{i}" for i in range(5)]
        assert s.sample(x.clone(), params, ids, banned=ban) == [2, 0, 2, 0, 0]


def test_a_top_p_below_float32_range_keeps_the_most_likely_token():
    s = Sampler(0, torch.device("cpu"))
    x = logits(3, seed=5)
    p = [SamplingParams(temperature=1.0, top_p=1e-300)] * 3
    assert s.sample(x.clone(), p, ["a", "b", "c"]) == x.argmax(-1).tolist()


def test_one_row_that_fails_to_sample_fails_alone(monkeypatch):
    x = logits(4, seed=2)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(4)]
    ids = ["a", "b", "c", "d"]
    clean = Sampler(0, torch.device("cpu")).sample(x.clone(), params, ids)
    s = Sampler(0, torch.device("cpu"))
    # an id past the logits fails the batched pass: each row is redone alone
    out = s.sample(x.clone(), params, ids, banned=[(), (10**6,), (), ()])
    assert isinstance(out[1], JobFault) and "IndexError" in out[1].message
    assert out[:1] + out[2:] == clean[:1] + clean[2:]
    # a failing draw
    real = Sampler._generator_for

    def generator_for(self, job_id, p):
        if job_id == "c":
            raise RuntimeError("no generator")
        return real(self, job_id, p)

    monkeypatch.setattr(Sampler, "_generator_for", generator_for)
    out = Sampler(0, torch.device("cpu")).sample(x.clone(), params, ids)
    assert out[2] == JobFault("sampling failed: RuntimeError: no generator")
    assert out[:2] + out[3:] == clean[:2] + clean[3:]

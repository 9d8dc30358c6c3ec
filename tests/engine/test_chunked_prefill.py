"""Chunked prefill in the real engine changes no token (greedy), whatever cuts the prompts.

With `prefill_chunk` > 0 an iteration carries at most that many prompt tokens beside
its decodes, so a prompt runs as chunks (each one continues a cached prefix) and its
boundaries are preemption points. Prompt lengths 1..600 (all at chunk 16; at the
others all to 200, then every chunk and block boundary and its neighbours) run at
chunk sizes that do (16, 64) and do not (48, 100) align with the 16-token KV block,
on the torch backend and on Triton (its CPU interpreter: a sample of lengths at
chunks 16 and 48, see TRITON_LENGTHS),
against the unchunked run of the same backend; seeded sampling draws the same tokens.
A partly prefilled job is swapped out or dropped under every KV policy and resumes,
or is aborted; a job dropped after its first tokens re-prefills them in chunks;
chunking is retuned while a prompt is half in; bad settings are refused; a prompt
longer than max_batch_tokens runs in chunks only; and no chunk starves the running
decodes of their step.

A fixed cost model stands in for the start-up calibration (deterministic scheduling,
and no interpreter time spent calibrating), and torch runs on one thread: on a small
shared machine OpenMP's spinning threads cost far more than they give to a model
this small.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from fsd import LLM, SamplingParams
from fsd.config import CacheConfig, EngineConfig, SchedConfig
from fsd.cost import CostModel
from fsd.errors import ConfigError, PromptTooLongError, SettingError
from fsd.jobs import Job, KVLocation

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()
BLOCK = 16
CHUNKS = [16, 48, 64, 100]  # 48 and 100 are not whole blocks
ALL_LENGTHS = list(range(1, 601))
# Triton's CPU interpreter pays about 5 ms per token and layer (store_kv runs one
# program per token) and ~70 ms per decode call: all 600 lengths (180k prompt tokens a
# run, 11.5k iterations at chunk 16) would take hours. Without a GPU it runs these,
# which straddle the block size and the chunk sizes it runs; on a GPU, all 600.
TRITON_LENGTHS = [1, 15, 16, 17, 47, 48, 49, 65]
# without a GPU the interpreter runs one whole-block chunk and one that is not
TRITON_CHUNKS = CHUNKS if CUDA else [16, 48]


def lengths_for(chunk: int) -> list[int]:
    """Every length at the smallest chunk (every block and chunk boundary up to 600);
    at the others every length up to 2 chunks of the largest, then each chunk and
    block boundary and its neighbours up to 600 (what differs between two lengths
    is where they end relative to a chunk and a block)."""
    if chunk == min(CHUNKS):
        return ALL_LENGTHS
    edges = {e + d for step in (chunk, BLOCK) for e in range(step, 601, step) for d in (-1, 0, 1)}
    dense = set(range(1, 2 * max(CHUNKS) + 1))
    return sorted(n for n in dense | edges if 1 <= n <= 600)


SWEEP_PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)
SWEEP_WINDOW = 8  # jobs in the engine at once: the walk stays short, iterations mix jobs


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("profile") / "fixed.json"
    CostModel(name="fixed-test").save(path)
    return str(path)


def prompt(i: int, n: int) -> list[int]:
    return [(i * 7 + k * 13) % 250 + 1 for k in range(n)]


def make(profile: str, chunk: int, **options: object) -> LLM:
    """tiny-opt under FCFS with 16-token blocks; `chunk` 0: chunking off (unset would
    derive a budget from the SLO)."""
    kw: dict[str, object] = dict(
        policy="fcfs", block_size=BLOCK, num_gpu_blocks=256, num_host_blocks=64, dtype="float32"
    )
    kw.update(options)
    return LLM("tiny-opt", prefill_chunk=chunk, profile=profile, **kw)


# ----------------------------------------------------------------------------- the sweep


def sweep(
    profile: str, backend: str, chunk: int, lengths: Sequence[int], window: int = SWEEP_WINDOW
) -> list[list[int]]:
    """Each prompt's tokens; jobs enter as earlier ones finish, `window` at a time.

    Checks each iteration as it goes: the prompt tokens it carries (in steps of more
    than one token) stay within the chunk, and a chunk that stops short of its prompt's end is at least one block and
    samples no token.
    """
    llm = LLM(
        "tiny-opt",
        policy="fcfs",
        attn_backend=backend,
        dtype="float32",  # (the default on CPU; on a GPU fp16 rounding could flip a token)
        prefill_chunk=chunk,
        block_size=BLOCK,
        num_gpu_blocks=1024,
        num_host_blocks=16,
        max_batch_size=64,
        max_batch_tokens=4096,
        profile=profile,
        prefix_cache=False,  # every chunk starts where the test saw the last one end
    )
    eng = llm.engine
    todo = list(range(len(lengths)))
    index: dict[str, int] = {}
    tokens: dict[int, list[int]] = {}
    live: dict[str, Job] = {}
    partial_chunks = 0
    while todo or eng.has_unfinished():
        while todo and len(live) < window:
            i = todo.pop()
            job = eng.add_request(prompt(lengths[i], lengths[i]), SWEEP_PARAMS)
            index[job.job_id] = i
            live[job.job_id] = job
        before = {job_id: job.num_computed_tokens for job_id, job in live.items()}
        outputs = {job_id: len(job.output_token_ids) for job_id, job in live.items()}
        for delta in eng.step():
            if delta.output is not None:
                tokens[index[delta.job_id]] = delta.output.token_ids
                del live[delta.job_id]
        out = eng.last_schedule
        assert out is not None
        prompt_tokens = 0
        for job in out.batch:
            start = before[job.job_id]
            if start < job.num_prompt_tokens:  # a prefill, or a chunk of one
                # (a one-token step is a decode's work, the budget's or not: a 1-token
                # prompt, or the last token of a prompt cut one short of its end)
                prompt_tokens += job.step_tokens if job.step_tokens > 1 else 0
                if start + job.step_tokens < job.num_prompt_tokens:
                    partial_chunks += 1
                    assert job.step_tokens >= BLOCK, (job.job_id, start, job.step_tokens)
                    assert job.num_computed_tokens == start + job.step_tokens
                    assert len(job.output_token_ids) == outputs[job.job_id] == 0
        if chunk:
            assert prompt_tokens <= chunk
    if chunk and max(lengths) > chunk:
        assert partial_chunks > 0  # the run really cut prompts
    if not chunk:
        assert partial_chunks == 0  # the reference prefills whole prompts
    eng.blocks.check()
    assert eng.blocks.device.num_free == eng.blocks.device.num_blocks
    llm.close()
    assert sorted(tokens) == list(range(len(lengths)))
    return [tokens[i] for i in range(len(lengths))]


@pytest.fixture(scope="module")
def unchunked(profile: str) -> Callable[[str], list[list[int]]]:
    """The unchunked run of a backend, made once on first use."""
    runs: dict[str, list[list[int]]] = {}

    def get(backend: str) -> list[list[int]]:
        if backend not in runs:
            lengths = ALL_LENGTHS if backend == "torch" or CUDA else TRITON_LENGTHS
            runs[backend] = sweep(profile, backend, 0, lengths, window=len(lengths))
        return runs[backend]

    return get


def assert_same(got: list[list[int]], want: list[list[int]], lengths: Sequence[int]) -> None:
    bad = [n for n, a, b in zip(lengths, got, want, strict=True) if a != b]
    assert not bad, f"prompt lengths whose tokens changed: {bad[:20]} ({len(bad)} in all)"
    assert all(len(t) == SWEEP_PARAMS.max_tokens for t in got)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", CHUNKS)
def test_every_prompt_length_gives_the_unchunked_tokens_on_torch(profile, unchunked, chunk):
    lengths = lengths_for(chunk)
    got = sweep(profile, "torch", chunk, lengths)
    want = dict(zip(ALL_LENGTHS, unchunked("torch"), strict=True))
    assert_same(got, [want[n] for n in lengths], lengths)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("chunk", TRITON_CHUNKS)
def test_prompt_lengths_give_the_unchunked_tokens_on_triton(profile, unchunked, chunk):
    lengths = ALL_LENGTHS if CUDA else TRITON_LENGTHS
    got = sweep(profile, "triton", chunk, lengths)
    assert_same(got, unchunked("triton"), lengths)


@pytest.mark.skipif(not HAS_TRITON or CUDA, reason="the interpreter's sample of lengths")
def test_triton_unchunked_tokens_equal_torch_on_the_sampled_lengths(unchunked):
    torch_tokens = dict(zip(ALL_LENGTHS, unchunked("torch"), strict=True))
    assert unchunked("triton") == [torch_tokens[n] for n in TRITON_LENGTHS]


def test_seeded_sampling_draws_the_same_tokens_in_chunks(profile):
    # a chunk that stops short of the end draws nothing: the job's generator must not move
    prompts = [prompt(i, n) for i, n in enumerate([70, 33, 150, 5])]
    params = [SamplingParams(max_tokens=12, temperature=0.9, seed=s) for s in (1, 2, 3, 4)]
    want = make(profile, 0).generate(prompts, params)
    got = make(profile, 32).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


# ----------------------------------------------------------------------------- preemption

LONG = prompt(99, 160)  # ten blocks, prefilled 16 tokens an iteration
# its cap is past the short jobs': before lengths are learned the caps rank started
# jobs (fsd.sched.lengths, "Cold start"), and the long job is to be the lowest
LONG_PARAMS = SamplingParams(max_tokens=64, ignore_eos=True)
SHORT = [prompt(i, 20) for i in range(4)]
SHORT_PARAMS = SamplingParams(max_tokens=50, ignore_eos=True)  # 70 tokens: 5 blocks each


@pytest.fixture(scope="module")
def alone(profile: str) -> dict[str, list[int]]:
    llm = make(profile, 0)
    out = {"long": llm.generate(LONG, LONG_PARAMS)[0].token_ids}
    for i, p in enumerate(SHORT):
        out[f"short{i}"] = llm.generate(p, SHORT_PARAMS)[0].token_ids
    return out


def _long_beside_decodes(profile, kv_policy: str):
    """A 16-block pool: four short jobs start decoding, then the long prompt arrives."""
    llm = LLM(
        "tiny-opt",
        policy="fsd",  # fsd's rules less the swap gate: the long job must be preempted
        **{"fsd.swap_gate": False},
        kv_policy=kv_policy,
        dtype="float32",
        prefill_chunk=16,
        block_size=BLOCK,
        num_gpu_blocks=16,
        num_host_blocks=64,
        max_batch_size=8,
        profile=profile,
    )
    eng = llm.engine
    shorts = [eng.add_request(p, SHORT_PARAMS) for p in SHORT]
    eng.step()
    eng.step()
    return eng, shorts, eng.add_request(LONG, LONG_PARAMS)


@pytest.mark.parametrize("kv_policy", ["defer", "recompute", "reactive", "proactive"])
def test_a_partly_prefilled_job_is_preempted_and_resumes_intact(profile, alone, kv_policy):
    """Four decoding jobs grow into a 16-block pool while a long prompt is chunked in
    beside them: the long (lowest) job is evicted half-prefilled, and later resumes."""
    eng, shorts, long = _long_beside_decodes(profile, kv_policy)
    swapped_out: list[tuple[int, int, bool]] = []  # (computed, blocks moved, sync)
    swapped_in = 0
    dropped: list[int] = []  # computed tokens lost
    idle_partial = 0  # iterations the long job sat out, partly prefilled
    steps = 0
    while eng.has_unfinished():
        before = long.num_computed_tokens
        eng.step()
        steps += 1
        assert steps < 2000
        out = eng.last_schedule
        if out is None:
            continue
        for op in out.swap_out:
            if op.job is long:
                assert long not in out.batch
                assert len(op.src) == len(op.dst) == len(long.host_block_table)
                swapped_out.append((before, len(op.src), op.sync))
        swapped_in += sum(op.job is long for op in out.swap_in)
        if long in out.recomputed:
            dropped.append(before)
            assert long.num_computed_tokens == 0 and not long.block_table
        prompt_len = long.num_prompt_tokens
        if 0 < long.num_computed_tokens < prompt_len and long not in out.batch:
            idle_partial += 1
            if long.kv is KVLocation.DEVICE:  # waiting on the device: nothing beyond its chunks
                assert len(long.block_table) == math.ceil(long.num_computed_tokens / BLOCK)
        eng.blocks.check()
    assert long.output_token_ids == alone["long"]
    for i, job in enumerate(shorts):
        assert job.output_token_ids == alone[f"short{i}"]
    prompt_len = len(LONG)
    if kv_policy in ("reactive", "proactive"):
        # swapped out partly prefilled: only its filled blocks moved, and it came back
        partial = [(c, n) for c, n, _ in swapped_out if 0 < c < prompt_len]
        assert partial, swapped_out
        for computed, moved in partial:
            assert moved == math.ceil(computed / BLOCK) < math.ceil(prompt_len / BLOCK)
        assert swapped_in == len(swapped_out) and long.recomputes == 0
        if kv_policy == "proactive":
            assert any(not sync for _, _, sync in swapped_out)  # beside the step
    else:
        assert any(0 < c < prompt_len for c in dropped), dropped
        assert long.recomputes == len(dropped) and not swapped_out
    assert idle_partial > 0 and long.preemptions > 0
    blocks = eng.blocks
    blocks.check()
    assert blocks.device.num_free == 16 and blocks.host.num_free == 64
    assert not eng.swapper.busy and not eng.has_unfinished()


@pytest.mark.parametrize("where", [KVLocation.DEVICE, KVLocation.HOST])
def test_aborting_a_partly_prefilled_job_returns_its_blocks(profile, alone, where):
    eng, shorts, long = _long_beside_decodes(profile, "reactive")
    for _ in range(200):
        eng.step()
        if long.kv is where and 0 < long.num_computed_tokens < long.num_prompt_tokens:
            break
    else:
        pytest.fail(f"the long job was never partly prefilled on the {where.value}")
    held = len(long.block_table) + len(long.host_block_table)
    assert held == math.ceil(long.num_computed_tokens / BLOCK)
    out = eng.abort(long.job_id)
    assert out.finish_reason == "abort" and out.token_ids == []
    assert not long.block_table and not long.host_block_table and long.kv is KVLocation.NONE
    eng.blocks.check()
    while eng.has_unfinished():
        eng.step()
    assert [j.output_token_ids for j in shorts] == [alone[f"short{i}"] for i in range(4)]
    assert eng.blocks.device.num_free == 16 and eng.blocks.host.num_free == 64


CHURN_PROMPTS = [prompt(i, n) for i, n in enumerate([60, 45, 70, 33, 90, 20])]
CHURN_PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def churn_alone(profile: str) -> list[list[int]]:
    return [o.token_ids for o in make(profile, 0).generate(CHURN_PROMPTS, CHURN_PARAMS)]


@pytest.mark.parametrize("kv_policy", ["defer", "recompute", "reactive", "proactive"])
def test_jobs_preempted_after_their_first_tokens_resume_in_chunks(profile, churn_alone, kv_policy):
    """Demotion churn on 14 blocks: a job whose KV is dropped re-prefills its prompt and
    its output so far, in chunks; a swapped one comes back where it stopped."""
    llm = make(
        profile,
        16,
        policy="sj-mlfq",  # demotion at every quantum's end, no preemption threshold
        kv_policy=kv_policy,
        num_gpu_blocks=14,
        max_batch_size=4,
    )
    eng = llm.engine
    jobs = [eng.add_request(p, CHURN_PARAMS) for p in CHURN_PROMPTS]
    dropped_with_output = rechunked = 0
    while eng.has_unfinished():
        outputs = {j.job_id: len(j.output_token_ids) for j in jobs}
        computed = {j.job_id: j.num_computed_tokens for j in jobs}
        eng.step()
        out = eng.last_schedule
        if out is None:
            continue
        dropped_with_output += sum(outputs[j.job_id] > 0 for j in out.recomputed)
        for j in out.batch:  # a re-prefill of prompt + output, cut short of its end
            fed = computed[j.job_id] + j.step_tokens
            rechunked += outputs[j.job_id] > 0 and j.step_tokens > 1 and fed < j.num_tokens
        eng.blocks.check()
    assert [j.output_token_ids for j in jobs] == churn_alone
    if kv_policy in ("defer", "recompute"):
        assert dropped_with_output > 0 and rechunked > 0
    else:
        assert sum(j.swaps_out for j in jobs) > 0 and sum(j.recomputes for j in jobs) == 0
    assert eng.blocks.device.num_free == 14 and eng.blocks.host.num_free == 64
    assert not eng.swapper.busy


# ----------------------------------------------------------------------------- retune

RETUNE_PROMPTS = [prompt(i, n) for i, n in enumerate([300, 7, 130, 41])]
RETUNE_PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def retune_expected(profile: str) -> list[list[int]]:
    llm = make(profile, 0)
    return [o.token_ids for o in llm.generate(RETUNE_PROMPTS, RETUNE_PARAMS)]


def retune_llm(profile: str, chunk: int) -> LLM:
    return make(profile, chunk, max_batch_tokens=512)


def test_retuning_the_chunk_mid_prefill_loses_nothing(profile, retune_expected):
    llm = retune_llm(profile, 16)
    eng = llm.engine
    jobs = [eng.add_request(p, RETUNE_PARAMS) for p in RETUNE_PROMPTS]
    first = jobs[0]
    seen: dict[int, list[int]] = {16: [], 64: [], 0: []}
    retuned = []
    while eng.has_unfinished():
        chunk = eng.config.sched.prefill_chunk
        if chunk == 16 and first.num_computed_tokens >= 48:
            assert 0 < first.num_computed_tokens < first.num_prompt_tokens
            retuned.append(first.num_computed_tokens)
            assert eng.retune(prefill_chunk=64).sched.prefill_chunk == 64
        elif chunk == 64 and first.num_computed_tokens >= 176:
            assert 0 < first.num_computed_tokens < first.num_prompt_tokens
            retuned.append(first.num_computed_tokens)
            eng.retune(prefill_chunk=0)
        chunk = eng.config.sched.prefill_chunk
        eng.step()
        out = eng.last_schedule
        assert out is not None
        seen[chunk].extend(j.step_tokens for j in out.batch if j.step_tokens > 1)
    assert len(retuned) == 2
    assert seen[16] and max(seen[16]) <= 16
    assert 64 in seen[64] and max(seen[64]) <= 64
    # chunking off: the rest of the half-done prompt runs whole, from where it stopped
    assert first.num_prompt_tokens - retuned[1] in seen[0]
    assert [j.output_token_ids for j in jobs] == retune_expected
    eng.blocks.check()
    assert eng.blocks.device.num_free == eng.blocks.device.num_blocks


def test_chunking_turned_on_mid_run_cuts_the_queued_prompts(profile, retune_expected):
    llm = retune_llm(profile, 0)
    eng = llm.engine
    jobs = [eng.add_request(p, RETUNE_PARAMS) for p in RETUNE_PROMPTS]
    eng.retune(prefill_chunk=32)
    steps = []
    while eng.has_unfinished():
        eng.step()
        steps.extend(j.step_tokens for j in eng.last_schedule.batch)
    assert max(steps) <= 32
    assert [j.output_token_ids for j in jobs] == retune_expected


# ----------------------------------------------------------------------------- bad input


def test_a_negative_chunk_is_refused():
    with pytest.raises(ConfigError, match="prefill_chunk"):
        SchedConfig(prefill_chunk=-1)


@pytest.mark.parametrize("chunk", [1, 8, 15])
def test_a_chunk_below_one_block_is_refused(chunk):
    with pytest.raises(ConfigError, match="prefill_chunk"):
        EngineConfig(cache=CacheConfig(block_size=16), sched=SchedConfig(prefill_chunk=chunk))
    with pytest.raises(ConfigError, match="prefill_chunk"):
        LLM("tiny-opt", block_size=16, prefill_chunk=chunk)


@pytest.mark.parametrize("chunk", [None, 0, 16, 17, 4096])
def test_chunks_of_at_least_one_block_are_accepted(chunk):
    config = EngineConfig(cache=CacheConfig(block_size=16), sched=SchedConfig(prefill_chunk=chunk))
    assert config.sched.prefill_chunk == chunk


@pytest.mark.parametrize(("value", "match"), [(5, "prefill_chunk"), (-3, "prefill_chunk")])
def test_a_refused_chunk_retune_changes_nothing(profile, retune_expected, value, match):
    llm = retune_llm(profile, 16)
    eng = llm.engine
    jobs = [eng.add_request(p, RETUNE_PARAMS) for p in RETUNE_PROMPTS]
    for _ in range(4):
        eng.step()
    assert 0 < jobs[0].num_computed_tokens < jobs[0].num_prompt_tokens
    before = eng.config
    with pytest.raises(SettingError, match=match):
        eng.retune(prefill_chunk=value)
    with pytest.raises(SettingError, match=match):
        eng.retune(prefill_chunk=value, max_batch_size=3)  # nothing of it applies
    assert eng.config == before and eng.scheduler.config.prefill_chunk == 16
    assert eng.scheduler.config.max_batch_size == before.sched.max_batch_size
    steps = []
    while eng.has_unfinished():
        eng.step()
        steps.extend(j.step_tokens for j in eng.last_schedule.batch)
    assert max(steps) == 16
    assert [j.output_token_ids for j in jobs] == retune_expected


def test_a_prompt_longer_than_the_token_budget_runs_in_chunks_only(profile):
    long = [prompt(5, 300), prompt(6, 129)]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    want = make(profile, 0).generate(long, params)
    chunked = make(profile, 64, max_batch_tokens=128)
    got = chunked.generate(long, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert chunked.engine.blocks.device.num_free == 256
    plain = make(profile, 0, max_batch_tokens=128)
    with pytest.raises(PromptTooLongError, match="max_batch_tokens"):
        plain.generate(long, params)
    with pytest.raises(PromptTooLongError, match="max_batch_tokens"):
        plain.engine.add_request(long[0], params)
    assert not plain.engine.has_unfinished()


def test_a_long_prompt_queued_under_chunking_still_runs_once_it_is_off(profile):
    # accepted because chunks could carry it; with chunking retuned away it runs alone
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    want = make(profile, 0).generate(prompt(3, 200), params)[0].token_ids
    llm = make(profile, 64, max_batch_tokens=128)
    job = llm.engine.add_request(prompt(3, 200), params)
    llm.engine.retune(prefill_chunk=0)
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert job.output_token_ids == want


# ----------------------------------------------------------------------------- decodes first


def test_every_iteration_with_a_chunk_carries_every_running_decode(profile):
    """Plain MLFQ demotes the decoding jobs, so the long prompt that arrives later is
    walked first; its chunks must still leave a token to each decode (Sarathi-Serve's
    stall-free batching), in a budget that the chunk alone could fill."""
    llm = LLM(
        "tiny-opt",
        policy="mlfq",
        quanta=(1e-9, 2e-9, 4e-9, 8e-9),
        dtype="float32",
        prefill_chunk=48,
        max_batch_tokens=48,
        max_batch_size=8,
        block_size=BLOCK,
        num_gpu_blocks=256,
        num_host_blocks=16,
        profile=profile,
    )
    eng = llm.engine
    decoders = [
        eng.add_request(prompt(i, 5 + i), SamplingParams(max_tokens=60, ignore_eos=True))
        for i in range(5)
    ]
    for _ in range(4):
        eng.step()
    assert all(len(j.output_token_ids) > 0 for j in decoders)
    long = eng.add_request(prompt(9, 300), SamplingParams(max_tokens=3, ignore_eos=True))
    chunk_iterations = walked_first = 0
    while eng.has_unfinished():
        ready = {
            j.job_id: len(j.output_token_ids)
            for j in decoders
            if j.kv is KVLocation.DEVICE and j.num_new_tokens == 1 and not j.status.finished
        }
        prefilling = long.num_computed_tokens < long.num_prompt_tokens
        eng.step()
        batch = eng.last_schedule.batch
        ids = {j.job_id for j in batch}
        if prefilling:  # no decode skips a step while the prompt goes in
            assert ready.keys() <= ids, sorted(ready.keys() - ids)
            for j in decoders:
                if j.job_id in ready:
                    assert len(j.output_token_ids) == ready[j.job_id] + 1
        if long in batch and long.step_tokens > 1:
            chunk_iterations += 1
            assert ready.keys() <= ids
            assert sum(j.step_tokens for j in batch) <= 48
            walked_first += batch[0] is long and long.step_tokens == 48 - len(ready)
    assert chunk_iterations >= 300 // 48
    assert walked_first > 0  # the case that needs the reserve happened
    assert all(len(j.output_token_ids) == 60 for j in decoders)
    assert len(long.output_token_ids) == 3


def test_a_burst_of_new_prompts_does_not_stall_the_running_decodes(profile):
    """More waiting prompts ahead of the decodes (MLFQ puts new jobs on top) than the
    walk passes over once the prefill budget is spent (4 x max_batch_size): the chunk
    reserved the decodes their tokens, so they must still be reached and run."""
    llm = make(
        profile,
        32,
        policy="mlfq",
        quanta=(1e-9, 2e-9, 4e-9, 8e-9),
        max_batch_tokens=64,
        max_batch_size=4,
    )
    eng = llm.engine
    decoders = [
        eng.add_request(prompt(i, 3), SamplingParams(max_tokens=30, ignore_eos=True))
        for i in range(2)
    ]
    for _ in range(4):
        eng.step()
    burst = [
        eng.add_request(prompt(20 + i, 40), SamplingParams(max_tokens=2, ignore_eos=True))
        for i in range(20)
    ]
    for _ in range(3):
        ready = [j.job_id for j in decoders if j.num_new_tokens == 1 and not j.status.finished]
        eng.step()
        batch = eng.last_schedule.batch
        assert any(j.step_tokens > 1 for j in batch)  # a prompt's chunk is in
        assert set(ready) <= {j.job_id for j in batch}, [(j.job_id, j.step_tokens) for j in batch]
    while eng.has_unfinished():
        eng.step()
    assert all(len(j.output_token_ids) == 2 for j in burst)

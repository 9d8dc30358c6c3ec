"""The Mooncake JSONL reader: the shipped trace, scaling, limits, prefix hashes carried
through every transformation, and errors that name file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsd.errors import ConfigError
from fsd.workload import Request, Workload, read_mooncake
from fsd.workload.trace import TraceRef

SHIPPED = (
    Path(__file__).resolve().parents[2] / "scenarios" / "traces" / "mooncake-conversation.jsonl"
)


def line(t: object = 0, n: object = 600, m: object = 10, h: object = None, **extra) -> str:
    obj = {"timestamp": t, "input_length": n, "output_length": m, "hash_ids": h or [0, 1]}
    return json.dumps({**obj, **extra})


GOOD = "\n".join(
    [
        line(0, 1024, 40, [0, 1]),
        line(500, 600, 7, [0, 2]),
        line(2500.5, 513, 0, [3, 4]),
        line(3500, 100, 9, [5]),
    ]
)


def write(tmp_path: Path, text: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    return path


def test_reads_ms_timestamps_lengths_and_hashes(tmp_path):
    w = read_mooncake(write(tmp_path, GOOD))
    assert [r.arrival for r in w] == pytest.approx([0.0, 0.5, 2.5005, 3.5])
    assert [r.prompt_len for r in w] == [1024, 600, 513, 100]
    assert [r.output_len for r in w] == [40, 7, 1, 9]  # 0 generated -> 1
    assert w.prefix_hashes == ((0, 1), (0, 2), (3, 4), (5,))
    assert w.prefix_of(1) == (0, 2)
    assert w.source == "t.jsonl"
    assert w.params["zero_outputs"] == 1 and w.params["format"] == "mooncake"
    assert w.params["time_scale"] == 1.0 and "limit" not in w.params


@pytest.mark.parametrize(("scale", "gap"), [(0.5, 1.0), (1.0, 0.5), (2.0, 0.25)])
def test_time_scale_multiplies_the_rate(tmp_path, scale, gap):
    w = read_mooncake(write(tmp_path, GOOD), time_scale=scale)
    assert w[1].arrival == pytest.approx(gap)
    assert w[3].arrival == pytest.approx(3.5 / scale)
    assert w.params["time_scale"] == scale


def test_limit_keeps_the_first_requests(tmp_path):
    w = read_mooncake(write(tmp_path, GOOD), limit=2)
    assert len(w) == 2 and w.params["limit"] == 2
    assert w.prefix_hashes == ((0, 1), (0, 2))
    with pytest.raises(ConfigError, match="limit must be >= 1"):
        read_mooncake(write(tmp_path, GOOD), limit=0)


def test_unsorted_lines_are_sorted_with_their_hashes_and_blank_lines_skipped(tmp_path):
    text = "\n".join(
        [line(2000, 5, 1, [9]), "", "   ", line(1000, 6, 2, [8]), line(1000, 7, 3, [0])]
    )
    w = read_mooncake(write(tmp_path, text))
    assert [(r.arrival, r.prompt_len) for r in w] == [(0.0, 6), (0.0, 7), (1.0, 5)]
    assert w.prefix_hashes == ((8,), (0,), (9,))  # equal times keep file order


def test_inline_trace_ref_and_extra_keys(tmp_path):
    ref = TraceRef("inline.jsonl", text=line(7, 3, 2, [4], session="x") + "\n")
    w = read_mooncake(ref)
    assert w[0] == (0.0, 3, 2) and w.prefix_hashes == ((4,),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", r"t\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"t\.jsonl:2: expected a JSON object, got an array"),
        ('{"timestamp": 1, "input_length": 5}', r"t\.jsonl:2: missing field\(s\) output_length"),
        (line(t="soon"), r"t\.jsonl:2: field timestamp: 'soon' is not a finite number"),
        (
            line(t=-1),
            r"t\.jsonl:2: field timestamp: -1 is not a finite number of milliseconds >= 0",
        ),
        (line(t=True), r"t\.jsonl:2: field timestamp: True"),
        (line(t=float("nan")), r"t\.jsonl:2: field timestamp: nan"),
        (line(t=float("inf")), r"t\.jsonl:2: field timestamp: inf"),
        (line(n=0), r"t\.jsonl:2: field input_length: 0 must be >= 1"),
        (line(n=12.5), r"t\.jsonl:2: field input_length: 12.5 is not a whole number"),
        (line(n="12"), r"t\.jsonl:2: field input_length: '12' is not a whole number"),
        (line(n=True), r"t\.jsonl:2: field input_length: True is not a whole number"),
        (line(m=-3), r"t\.jsonl:2: field output_length: -3 must be >= 0"),
        (line(m=None), r"t\.jsonl:2: field output_length: None is not a whole number"),
        (line(m=float("nan")), r"t\.jsonl:2: field output_length: nan is not a whole number"),
        (line(h="0,1"), r"t\.jsonl:2: field hash_ids: expected a list of integers"),
        (line(h=[0, "a"]), r"t\.jsonl:2: field hash_ids: item 1 \('a'\) is not an integer"),
        (line(h=[0, False]), r"t\.jsonl:2: field hash_ids: item 1 \(False\)"),
        (line(h=[1.5]), r"t\.jsonl:2: field hash_ids: item 0 \(1\.5\)"),
        # hashes that do not match the prompt's 512-token blocks: named, not simulated
        (
            line(n=2000, h=[1, 2]),
            r"t\.jsonl:2: field hash_ids: 2 ids for a prompt of 2000 tokens, which takes 4 blocks",
        ),
        (
            line(n=512, h=[1, 2]),
            r"t\.jsonl:2: field hash_ids: 2 ids for a prompt of 512 tokens, which takes 1 ",
        ),
    ],
)
def test_malformed_lines_name_file_line_and_field(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        read_mooncake(write(tmp_path, line() + "\n" + body))


def test_file_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"t\.jsonl: the trace has no requests"):
        read_mooncake(write(tmp_path, "\n\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        read_mooncake(tmp_path / "missing.jsonl")
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(line().encode() + b"\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bin\.jsonl:\d+: not UTF-8"):
        read_mooncake(bad)
    with pytest.raises(ConfigError, match="time_scale must be > 0"):
        read_mooncake(write(tmp_path, GOOD), time_scale=0.0)


def test_transformations_keep_each_requests_hashes(tmp_path):
    w = read_mooncake(write(tmp_path, GOOD))
    assert w.scaled(2.0).prefix_hashes == w.prefix_hashes
    assert w.head(3).prefix_hashes == w.prefix_hashes[:3]
    win = w.window(0.4, 2.2)
    assert [r.prompt_len for r in win] == [600, 513]
    assert win.prefix_hashes == ((0, 2), (3, 4))
    c = w.clipped(600)  # 1024 + 40 and 600 + 7 are past 600 tokens: their prompts are cut
    assert c.params["clipped"] == 2
    assert c.prefix_hashes == ((), (), (3, 4), (5,))  # a cut prompt's blocks no longer hold
    assert w.clipped(None) is w


def test_workload_refuses_hashes_that_do_not_match_its_requests():
    with pytest.raises(ConfigError, match="2 prefix hash lists for 1 requests"):
        Workload((Request(0.0, 5, 5),), prefix_hashes=((1,), (2,)))
    with pytest.raises(ConfigError, match="prefix hashes and requests differ in length"):
        Workload.from_arrays([0.0, 1.0], [5, 5], [5, 5], prefix_hashes=[(1,)])
    w = Workload.from_arrays([2.0, 1.0], [3, 4], [5, 6], prefix_hashes=[(7,), (8,)])
    assert w[0] == (1.0, 4, 6) and w.prefix_hashes == ((8,), (7,))
    assert Workload((Request(0.0, 5, 5),)).prefix_of(0) == ()


def test_shipped_conversation_trace():
    w = read_mooncake(SHIPPED)
    s = w.summary()
    assert s["requests"] == 12031 == len(w.prefix_hashes)
    assert 3500 < s["duration_s"] <= 3600  # one hour
    assert s["prompt_mean"] == pytest.approx(12035, abs=1)
    assert s["output_mean"] == pytest.approx(343, abs=1)
    assert s["prefix_reuse"] == pytest.approx(0.366, abs=0.001)  # data/README.md: 36.6%
    assert max(r.prompt_len for r in w) == 126195
    # one 512-token block per started 512 tokens of prompt
    assert all(len(h) == -(-r.prompt_len // 512) for r, h in zip(w, w.prefix_hashes, strict=True))
    fast = read_mooncake(SHIPPED, time_scale=2.0, limit=1000)
    assert len(fast) == 1000
    assert fast.duration == pytest.approx(w.head(1000).duration / 2)

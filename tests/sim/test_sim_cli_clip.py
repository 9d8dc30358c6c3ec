"""`fsd simulate` and the model's context: clipped requests are counted (stderr and the
JSON), `--no-clip` refuses them, and a Mooncake `.jsonl` trace is read by its suffix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsd.cli import app

# the default profile (opt-13b-a100) has a 2048-token context
LENGTHS = [(100, 20), (2000, 100), (1900, 10), (300, 3000), (2047, 1)]  # 2nd, 4th too long


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", "--policies", "fcfs", *args])


def jsonl(tmp_path: Path, lengths: list[tuple[int, int]]) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [
        {
            "timestamp": 400 * i,
            "input_length": n,
            "output_length": m,
            "hash_ids": [1000 * i + b for b in range(-(-n // 512))],  # a 512-token block each
        }
        for i, (n, m) in enumerate(lengths)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def text(r) -> str:
    return " ".join(r.stderr.split())


def test_clipped_requests_are_counted_on_stderr_and_in_the_json(tmp_path):
    out = tmp_path / "sim.json"
    r = run("--trace", str(jsonl(tmp_path, LENGTHS)), "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "note: clipped 2 of 5 requests to the 2048-token context" in text(r)
    work = json.loads(out.read_text())["workload"]
    assert work["clipped"] == 2 and work["max_context"] == 2048
    assert work["requests"] == 5 and work["format"] == "mooncake"  # read by its suffix
    assert work["prefix_blocks"] == 1 + 4 + 4  # the 2 clipped prompts lost their blocks


def test_no_clip_refuses_with_the_count_and_the_context(tmp_path):
    r = run("--trace", str(jsonl(tmp_path, LENGTHS)), "--no-clip")
    assert r.exit_code == 2
    assert "--no-clip: 2 of 5 requests of trace.jsonl exceed the 2048-token context" in text(r)
    assert "Traceback" not in r.stderr


def test_nothing_clipped_within_the_context(tmp_path):
    out = tmp_path / "sim.json"
    fits = [(100, 20), (2000, 48), (2047, 1)]
    r = run("--trace", str(jsonl(tmp_path, fits)), "--no-clip", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "clipped" not in r.stderr
    assert json.loads(out.read_text())["workload"]["clipped"] == 0


def test_a_wider_max_context_or_none_avoids_the_clip(tmp_path):
    out = tmp_path / "sim.json"
    trace = str(jsonl(tmp_path, LENGTHS))
    r = run("--trace", trace, "--no-clip", "--max-context", "4096", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["workload"]["clipped"] == 0


@pytest.mark.parametrize("extra", [[], ["--no-clip"]])
def test_synthetic_and_scenario_workloads_are_fitted_too(tmp_path, extra):
    out = tmp_path / "sim.json"
    r = run("--lengths", "code-bursty", "--limit", "40", "--json", str(out), *extra)
    if extra:
        assert r.exit_code == 2 and "of 40 requests" in text(r) and "--no-clip" in text(r)
    else:
        assert r.exit_code == 0, r.output
        clipped = json.loads(out.read_text())["workload"]["clipped"]
        assert 0 < clipped < 40 and f"clipped {clipped} of 40 requests" in text(r)
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        '[scenario]\nname = "long"\nseed = 1\nduration = 4.0\n\n'
        '[[phase]]\narrival = "poisson"\nrate = 5.0\nlengths = "mix:summarize+alpaca:0.5"\n'
    )
    r = run(str(scenario), "--max-context", "1024", *extra)
    if extra:
        assert r.exit_code == 2 and "1024-token context" in text(r)
    else:
        assert r.exit_code == 0, r.output
        assert "to the 1024-token context" in text(r)


def test_prefix_blocks_larger_than_the_pool_name_the_request_before_any_run(tmp_path):
    # request 2's prompt (its 4 hashed 512-token blocks) needs 113 blocks of 16 tokens
    # with its output; the device pool holds 100: one line naming it, no slow run
    trace = jsonl(tmp_path, [(100, 20), (1000, 10), (1800, 10)])
    r = run("--trace", str(trace), "--num-gpu-blocks", "100", "--policies", "fsd,fcfs")
    assert r.exit_code == 2
    assert "request 2: prompt of 1800 tokens" in text(r) and "the device pool has 100" in text(r)
    assert "simulating fsd: done" not in r.output + r.stderr
    assert "Traceback" not in r.stderr

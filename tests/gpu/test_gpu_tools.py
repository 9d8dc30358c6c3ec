"""The GPU benches and the check's summary, on this machine: what runs without a GPU.

The benches' --cpu-smoke runs go through the same code as on a GPU (Triton's
interpreter, the swapper's copy thread); the summary's verdicts are read from
synthetic results; the peers' layout helpers are checked against the reference.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fsd.kernels import reference

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU runs of the benches")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peers = _load("attn_peers")
summary = _load("gpu_summary")


def _bench(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# ----------------------------------------------------------------------------- benches


@CPU_ONLY
@pytest.mark.parametrize("script", ["kernels.py", "swap.py"])
def test_a_gpu_bench_without_cuda_says_so_and_exits_0(script: str) -> None:
    done = _bench(f"bench/{script}")
    assert done.returncode == 0, done.stderr
    assert "needs a CUDA device" in done.stdout and "nothing measured" in done.stdout


@CPU_ONLY
def test_parallel_on_cuda_without_gpus_skips_and_writes_why(tmp_path: Path) -> None:
    out = tmp_path / "parallel.json"
    done = _bench("bench/parallel.py", "--device", "cuda", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "skipped, no CUDA device" in done.stdout
    result = json.loads(out.read_text())
    assert result["skipped"] == "no CUDA device" and result["results"] == []


@CPU_ONLY
@pytest.mark.usefixtures("triton_ready")
def test_kernels_cpu_smoke_fills_every_section(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    done = _bench("bench/kernels.py", "--cpu-smoke", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["peers"]["decode"] == ["sdpa"]  # no library peer on this machine
    assert "not installed" in result["peers"]["status"]["flash_attn"]
    decode = result["decode"]
    assert [r["ragged"] for r in decode] == [False, True]
    for r in decode:  # the peer computed the same attention
        assert r["peers"]["sdpa"]["max_abs_diff"] < 1e-4 and r["best_peer"] == "sdpa"
    assert {r["cached_prefix"] for r in result["prefill"]} == {0, 24}
    assert all(r["peers"]["sdpa"]["max_abs_diff"] < 1e-4 for r in result["prefill"])
    assert result["store_kv"][0]["tokens"] == 16 and result["store_kv"][0]["gbps"] > 0
    lines = summary.figures(result, None, None)  # what the check's summary makes of it
    assert any(line.startswith("paged prefill 2x16+0: ") for line in lines)
    assert any(line.startswith("store_kv 16 tokens: ") for line in lines)


@CPU_ONLY
def test_swap_cpu_smoke_measures_both_directions(tmp_path: Path) -> None:
    out = tmp_path / "swap.json"
    done = _bench("bench/swap.py", "--cpu-smoke", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    modes = {(r["direction"], r["mode"]) for r in result["bandwidth"]}
    assert modes == {("out", "sync"), ("out", "async"), ("in", "sync"), ("in", "async")}
    rows = [(r["direction"], r["host_blocks"]) for r in result["overlap"]]
    assert rows == [(d, h) for d in ("out", "in") for h in ("scattered", "adjacent")]
    assert all(r["steps_during_swap"] >= 1 and r["inflation"] > 0 for r in result["overlap"])
    lines = summary.figures(None, result, {"skipped": "1 GPU"})
    assert sum(line.startswith("swap ") for line in lines) == 4
    assert sum(line.startswith("decode step while swapping") for line in lines) == 4
    assert "parallel: skipped (1 GPU)" in lines


# ----------------------------------------------------------------------------- peers' layouts


def _case(lens: list[int], block_size: int = 4) -> dict:
    gen = torch.Generator().manual_seed(0)
    counts = [-(-n // block_size) for n in lens]
    k = torch.randn(sum(counts) + 2, block_size, 2, 8, generator=gen)
    v = torch.randn(k.shape, generator=gen)
    order = torch.randperm(k.shape[0], generator=gen)
    tables = torch.zeros(len(lens), max(counts), dtype=torch.int32)
    used = 0
    for b, c in enumerate(counts):
        tables[b, :c] = order[used : used + c]
        used += c
    q = torch.randn(len(lens), 4, 8, generator=gen)
    return {"q": q, "k_cache": k, "v_cache": v, "tables": tables, "block_size": block_size,
            "lens": torch.tensor(lens, dtype=torch.int32)}  # fmt: skip


def _decode_ref(q, k, v, tables, lens) -> torch.Tensor:
    return reference.paged_decode_ref(q, k, v, tables, lens, 0.3)


def test_repaging_for_flash_attention_keeps_every_sequence() -> None:
    case = _case([5, 13, 1, 9])
    want = _decode_ref(case["q"], case["k_cache"], case["v_cache"], case["tables"], case["lens"])
    kc, vc, tables = peers.repage(case, page=8)
    assert kc.shape[1] == 8 and tables.shape == (4, 2)
    got = _decode_ref(case["q"], kc, vc, tables, case["lens"])
    torch.testing.assert_close(got, want)


def test_flashinfer_pages_list_each_sequences_blocks() -> None:
    case = _case([5, 8, 1])
    indptr, indices, last = peers.flashinfer_pages(case["tables"], case["lens"], 4)
    assert indptr.tolist() == [0, 2, 4, 5]
    assert last.tolist() == [1, 4, 1]
    t = case["tables"]
    assert indices.tolist() == [*t[0, :2].tolist(), *t[1, :2].tolist(), t[2, 0].item()]


def test_sdpa_decode_peer_masks_a_ragged_batch() -> None:
    case = _case([5, 13, 1, 9])
    fn, note = peers.decode_peer("sdpa", case, 0.3)
    want = _decode_ref(case["q"], case["k_cache"], case["v_cache"], case["tables"], case["lens"])
    torch.testing.assert_close(fn(), want, atol=1e-5, rtol=1e-5)
    assert "masked" in note


def test_ragged_lengths_keep_the_mean_and_spread() -> None:
    lens = peers.ragged_lens(16, 2048)
    assert len(lens) == 16 and sum(lens) / 16 == pytest.approx(2048, abs=1)
    assert min(lens) == 256 and max(lens) == 3840
    assert peers.ragged_lens(1, 100) == [100]


def test_prefill_flops_count_the_visible_pairs() -> None:
    # one sequence: 2 queries after 3 cached keys see 4 and 5 keys
    assert peers.prefill_flops([2], [5], num_heads=1, head_dim=1) == 4.0 * 9


# ----------------------------------------------------------------------------- summary


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA L40S", "l40s"),
        ("", "gpu"),
    ],
)
def test_gpu_slug(name: str, slug: str) -> None:
    assert summary.gpu_slug(name) == slug


def _decode_row(batch: int, ctx: int, fraction: float, paged_ms: float, peer_ms: float | None):
    return {"num_heads": 32, "num_kv_heads": 8, "batch": batch, "context": ctx, "ragged": False,
            "fraction_of_copy": fraction, "paged_ms": paged_ms, "best_peer_ms": peer_ms,
            "best_peer": "flash_attn" if peer_ms else None,
            "speedup_vs_best_peer": peer_ms / paged_ms if peer_ms else None}  # fmt: skip


def _write_results(folder: Path, fraction: float, peer_ms: float, step_ms: float) -> None:
    rows = [_decode_row(1, 32768, 0.2, 1.0, 0.5),  # outside the goal's range: ignored
            _decode_row(16, 2048, 0.95, 1.0, 1.1), _decode_row(64, 8192, fraction, 1.0, peer_ms)]  # fmt: skip
    kernels = {"machine": {"gpu": "NVIDIA H100 80GB HBM3"}, "copy": {"gbps": 3000.0},
               "decode": rows, "prefill": [], "store_kv": []}  # fmt: skip
    (folder / "kernels.json").write_text(json.dumps(kernels))
    roofline = {"model": "opt-1.3b", "step_ms": step_ms, "roofline_step_ms": 1.0,
                "copy_gb_s": 3000.0}  # fmt: skip
    (folder / "engine.json").write_text(json.dumps({"roofline": roofline}))
    (folder / "steps.tsv").write_text(
        "setup\t0\t12\t90\nkernels\t124\t150\t150\nswap\tskipped\t0\t0\n"
    )
    junit = '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1"/></testsuites>'
    (folder / "gpu-tests.xml").write_text(junit)


def test_summary_verdicts_goals_met_and_a_failed_test(tmp_path: Path) -> None:
    _write_results(tmp_path, fraction=0.9, peer_ms=1.2, step_ms=1.4)
    verdicts = summary.build(tmp_path)["verdicts"]
    assert [v["status"] for v in verdicts][:5] == ["NOT MET", "NO DATA", "MET", "MET", "MET"]
    assert verdicts[0]["detail"] == "3 passed, 1 failed, 1 skipped"


def test_summary_verdicts_name_the_worst_row(tmp_path: Path) -> None:
    _write_results(tmp_path, fraction=0.8, peer_ms=0.9, step_ms=1.6)
    bw, peer, roof = summary.build(tmp_path)["verdicts"][2:5]
    assert bw["status"] == "NOT MET" and "1/2 rows below" in bw["detail"]
    assert "80.0% of copy (32/8 b64 ctx8192)" in bw["detail"]
    assert peer["status"] == "NOT MET" and "0.90x flash_attn" in peer["detail"]
    assert roof["status"] == "NOT MET" and roof["ratio"] == pytest.approx(1.6)


def test_summary_report_writes_markdown_and_json(tmp_path: Path, capsys) -> None:
    _write_results(tmp_path, fraction=0.9, peer_ms=1.2, step_ms=1.4)
    assert summary.main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# GPU check: NVIDIA H100 80GB HBM3")
    assert "| kernels | timed out | 150 | 150 |" in text and "| swap | skipped |" in text
    assert json.loads((tmp_path / "summary.json").read_text())["verdicts"][2]["status"] == "MET"
    printed = capsys.readouterr().out
    assert "MET  Triton paged decode >= 85%" in printed


def test_summary_of_an_empty_folder_has_no_data(tmp_path: Path) -> None:
    statuses = {v["status"] for v in summary.build(tmp_path)["verdicts"]}
    assert statuses == {"NO DATA"}


def test_summary_verdicts_on_the_step_name_the_worst_figure(tmp_path: Path) -> None:
    overlap = [
        {"direction": "out", "blocks": 1024, "host_blocks": "adjacent", "inflation": 1.31,
         "step_alone_ms": 12.5, "step_during_swap_ms": 16.4},
        {"direction": "in", "blocks": 1024, "host_blocks": "scattered", "inflation": 1.02,
         "step_alone_ms": 12.5, "step_during_swap_ms": 12.7},
    ]  # fmt: skip
    (tmp_path / "swap.json").write_text(json.dumps({"overlap": overlap}))
    rows = [
        {"model": "opt-1.3b", "batch": 1, "step_ms": 0.8, "roofline_ms": 0.57, "x_roofline": 1.4,
         "target_x": 1.5, "host_not_hidden_ms": 0.05},
        {"model": "llama-1b", "batch": 32, "step_ms": 2.0, "roofline_ms": 0.8, "x_roofline": 2.5,
         "target_x": 2.0, "host_not_hidden_ms": 0.4},
    ]  # fmt: skip
    (tmp_path / "engine-gpu.json").write_text(json.dumps({"rows": rows, "copy_gb_s": 4000.0}))
    runs = [{"batch": 1, "ratio": 3.4, "sequences_equal": "1/1"},
            {"batch": 32, "ratio": 2.2, "sequences_equal": "32/32"}]  # fmt: skip
    (tmp_path / "hf.json").write_text(json.dumps({"runs": runs}))
    batch_one, swap, roof, hf, ragged = summary.build(tmp_path)["verdicts"][4:]
    assert batch_one["status"] == "MET" and batch_one["detail"].startswith("opt-1.3b: step 0.80 ms")
    assert swap["status"] == "NOT MET" and "x1.31: swap out of 1024 blocks (adjacent" in swap["detail"]
    assert roof["status"] == "NOT MET" and roof["detail"].startswith("1/2 rows over; worst llama-1b batch 32")
    assert hf["status"] == "MET" and "batch 1: 3.40x (1/1 same)" in hf["detail"]
    assert ragged["status"] == "NO DATA"

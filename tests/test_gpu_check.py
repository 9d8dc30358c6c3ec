"""scripts/gpu-check.sh on this machine: the plan without a GPU, and its orchestration.

A stand-in `nvidia-smi` on PATH decides whether the script sees a GPU, so these tests
behave the same on a GPU machine (they never start the real check). The run test
also gives it a stand-in venv python that passes every step at once except the
kernels bench, which outlives its cut-down time limit: the steps' records, the
budget, the skipped steps and the summary are what is checked.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
STEPS = ("setup", "kernels", "swap", "engine-gpu", "parity", "hf", "gpu-tests", "parallel", "summary")


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_smi(folder: Path, gpus: int) -> Path:
    """A bin folder whose nvidia-smi lists `gpus` H100s (none: it fails, as with no driver)."""
    if gpus == 0:
        body = "exit 9\n"
    else:
        lines = "\\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(gpus))
        body = (
            'case "$*" in\n'
            '  *query-gpu*) echo "NVIDIA H100 80GB HBM3" ;;\n'
            f'  *-L*) printf "{lines}\\n" ;;\n'
            "esac\n"
        )
    _exe(folder / "nvidia-smi", "#!/usr/bin/env bash\n" + body)
    return folder


def _run(*args: str, bin_dir: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FSD_GPU_CHECK_BUDGET", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_without_a_gpu_it_prints_the_plan_and_exits_0(tmp_path: Path) -> None:
    done = _run(bin_dir=_fake_smi(tmp_path, gpus=0))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "no CUDA device here" in out and "nothing is run" in out
    for i, step in enumerate(STEPS, start=1):
        assert f"{i}. {step}" in out
    assert "pytest -q -p no:cacheprovider -m gpu" in out
    assert "tests/kernels/test_kernels.py" in out and "tests/gpu/test_gpu_parity.py" in out
    assert "bench/kernels.py --quick" in out and "bench/parallel.py --device cuda" in out
    assert ">= 85% of measured copy bandwidth" in out and "during a swap <= 1.15x alone" in out
    assert "bench/engine_gpu.py" in out and "bench/hf_compare.py --device cuda" in out
    assert not (ROOT / "bench" / "results" / "gpu-<gpu>").exists()


@pytest.mark.parametrize(("gpus", "parallel_limit"), [(1, 30), (2, 150)])
def test_dry_run_on_a_gpu_machine_names_the_folder_after_the_gpu(
    tmp_path: Path, gpus: int, parallel_limit: int
) -> None:
    steps = ROOT / "bench" / "results" / "gpu-h100" / "steps.tsv"  # a real run's, committed
    before = steps.read_bytes() if steps.exists() else None
    done = _run("--dry-run", bin_dir=_fake_smi(tmp_path, gpus=gpus))
    assert done.returncode == 0, done.stderr
    assert "dry run; nothing is run" in done.stdout
    assert "results in bench/results/gpu-h100/, budget 480 s" in done.stdout
    assert f"parallel   <= {parallel_limit:3d} s" in done.stdout
    assert (steps.read_bytes() if steps.exists() else None) == before  # nothing written


def test_help_and_a_bad_option(tmp_path: Path) -> None:
    bin_dir = _fake_smi(tmp_path, gpus=0)
    done = _run("--help", bin_dir=bin_dir)
    assert done.returncode == 0 and "--dry-run" in done.stdout
    done = _run("--frobnicate", bin_dir=bin_dir)
    assert done.returncode == 2 and "unknown option --frobnicate" in done.stderr


def test_a_run_records_each_step_keeps_to_the_budget_and_writes_the_summary(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    _exe(
        venv / "bin" / "python",
        "#!/usr/bin/env bash\n"
        'case "$*" in\n'
        f'  *gpu_summary.py*) exec "{sys.executable}" "$@" ;;\n'
        "  *bench/kernels.py*) exec sleep 60 ;;\n"
        '  *) echo "stand-in python: $*" ;;\n'
        "esac\n",
    )
    out = tmp_path / "results"
    args = ("--venv", str(venv), "--out", str(out), "--budget", "30", "--no-peers")
    done = _run(*args, bin_dir=_fake_smi(tmp_path / "bin", gpus=1), timeout=90)
    assert done.returncode == 1, done.stdout + done.stderr  # the kernels step timed out
    records = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    status = {r[0]: r[1] for r in records}
    assert [r[0] for r in records] == list(STEPS[:-1])
    assert status["setup"] == "0"
    assert status["kernels"] == "124"  # timeout's status: cut to what the budget left
    assert {status[s] for s in STEPS[2:-1]} == {"skipped"}
    kernels_limit = int(records[1][3])
    assert 10 <= kernels_limit <= 15
    summary = (out / "summary.md").read_text()
    assert "| kernels | timed out |" in summary and "| swap | skipped | 0 | 0 |" in summary
    assert "NO DATA" in done.stdout and "wrote" in done.stdout

#!/usr/bin/env bash
# Create .venv and install fsd. `--test` adds the test dependencies.
# torch comes first: the CPU build (torch==2.13.0) when there is no NVIDIA GPU,
# so pip never pulls gigabytes of CUDA wheels onto a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # a CPU build left from before would satisfy `pip install torch`: remove it first
    .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
        2>/dev/null || { .venv/bin/python -m pip uninstall -y -q torch 2>/dev/null || true
                         "${pip[@]}" torch triton; }
else
    .venv/bin/python -c 'import torch' 2>/dev/null || "${pip[@]}" torch==2.13.0
fi
# (the filter drops pip's notes about this machine's local package mirrors)
"${pip[@]}" -e ".${extras}" 2>&1 | { grep -v '^WARNING: Location' || true; }
.venv/bin/python -c 'import fsd, torch; print(f"fsd {fsd.__version__} ready (torch {torch.__version__})")'

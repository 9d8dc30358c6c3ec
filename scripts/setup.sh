#!/usr/bin/env bash
# Create .venv and install fsd. `--test` adds the test dependencies.
# torch comes first: the CPU build (torch==2.13.0) when there is no NVIDIA GPU,
# so pip never pulls gigabytes of CUDA wheels onto a CPU machine.
# Each stage prints one line with the seconds so far; pip shows its own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python=${PYTHON:-python3}
stage() { echo "setup [$SECONDS s]: $*"; }
pip=(.venv/bin/python -m pip install --disable-pip-version-check)
# pip's notes about this machine's local package mirrors are dropped (stderr only, so
# that on a terminal pip still draws its download bars on stdout)
pip_install() { "${pip[@]}" "$@" 2> >(grep -v '^WARNING: Location' >&2 || true); }
if [ -x .venv/bin/python ]; then
    stage "using the existing .venv"
else
    stage "creating .venv with $python"
    "$python" -m venv .venv
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # a CPU build left from before would satisfy `pip install torch`: remove it first
    if .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        stage "torch with CUDA is already installed"
    else
        stage "installing torch (CUDA build) and triton: a few GB, minutes on a slow link"
        .venv/bin/python -m pip uninstall -y -q torch 2>/dev/null || true
        pip_install torch triton
    fi
elif .venv/bin/python -c 'import torch' 2>/dev/null; then
    stage "torch is already installed"
else
    stage "installing torch 2.13.0 (CPU build: no NVIDIA GPU found)"
    pip_install torch==2.13.0
fi
stage "installing fsd${extras} and its dependencies"
pip_install -e ".${extras}"
# an editable install leaves the pages in man/: link them where `man fsd` looks
stage "linking the man pages into .venv/share/man (man fsd, man fsctl)"
bash scripts/install-man.sh .venv
stage "checking the install"
.venv/bin/python -c 'import fsd, torch; print(f"fsd {fsd.__version__} ready (torch {torch.__version__})")'
stage "done"

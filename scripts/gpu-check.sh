#!/usr/bin/env bash
# The first GPU hour in one command: set up, GPU tests, HF parity on CUDA, every GPU bench,
# then a summary that says which goal each figure meets.
#
#   bash scripts/gpu-check.sh              # on a CUDA machine (8 minutes at most)
#   bash scripts/gpu-check.sh --dry-run    # print the plan, run nothing
#   options: --name NAME (results folder gpu-NAME), --out DIR (results folder), --budget S,
#            --venv DIR (default .venv), --no-peers, --setup-only
#
# Results go to bench/results/gpu-<name>/ (name: the GPU, e.g. h100): kernels.json,
# swap.json, engine-gpu.json, hf.json, parallel.json, the tests' JUnit files, logs/,
# summary.md and summary.json. The step's own measurements and the parity run first
# (bench/engine.py's OPT roofline is in engine-gpu.json; run it by hand for the rest). Each step
# has its own time limit, and every limit is cut to what is left of --budget (default
# 480 s), so the whole stays under 8 minutes; the summary always gets its last seconds. Without a CUDA device it prints the plan and exits 0.
#
# Setup: a .venv whose torch sees CUDA is used as it is; with no .venv, a python3
# that already has CUDA torch (an offline GPU image) gets a .venv that sees its
# packages (a .pth file), otherwise scripts/setup.sh --test builds one (downloads
# CUDA torch: allow more than the step's limit, e.g. run --setup-only first). A .venv
# with a CPU-only torch has torch replaced by the CUDA build. Wheels in .whl/ are
# installed first (offline machines). flash-attn and flashinfer are tried as binary
# wheels only (--no-peers skips them); a failed install only means that peer is skipped.
#
# Exit status: 0 when every step ran and the tests passed (goals not met are reported,
# not failed), 1 when a test step failed or a step crashed or timed out, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

dry_run=0 setup_only=0 peers=1 name="" dir="" budget=${FSD_GPU_CHECK_BUDGET:-480} venv=.venv
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --setup-only) setup_only=1 ;;
        --no-peers) peers=0 ;;
        --name) name=${2:?--name needs a value}; shift ;;
        --budget) budget=${2:?--budget needs seconds}; shift ;;
        --out) dir=${2:?--out needs a folder}; shift ;;
        --venv) venv=${2:?--venv needs a folder}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
pip() { "$venv/bin/python" -m pip "$@" --disable-pip-version-check --retries 1 --timeout 15; }

setup() {
    local python=${PYTHON:-python3}
    if [ -x "$venv/bin/python" ]; then
        if ! cuda_torch "$venv/bin/python"; then
            echo "setup: $venv has a torch without CUDA; installing the CUDA build"
            local ver
            ver=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
            pip uninstall -y -q torch
            pip install -q "torch==${ver:-0}" triton || pip install -q torch triton
        fi
    elif cuda_torch "$python"; then
        # A .pth file, not --system-site-packages: that would show the base interpreter's
        # packages, not those of a venv `python3` may itself be (as on GPU images).
        echo "setup: $python has CUDA torch; $venv sees its packages through a .pth file"
        "$python" -m venv --without-pip "$venv" || return 1
        local site
        site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$python" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_fsd_base.pth"
    else
        bash scripts/setup.sh --test || return 1
    fi
    if compgen -G ".whl/*.whl" >/dev/null; then
        echo "setup: installing the wheels in .whl/"
        pip install -q --no-index --no-deps .whl/*.whl || echo "setup: some .whl/ wheels failed"
    fi
    if ! "$venv/bin/python" -c 'import fsd.kernels' 2>/dev/null; then
        # what the GPU checks import; when all of it is there, nothing is downloaded
        if "$venv/bin/python" -c 'import numpy, safetensors, tokenizers, rich, pytest, transformers' \
            2>/dev/null; then
            pip install -q --no-deps --no-build-isolation -e . || return 1
        else
            pip install -q -e ".[test]" || return 1
        fi
    fi
    if [ "$peers" = 1 ]; then
        local pins
        pins=$(mktemp)
        "$venv/bin/python" -c 'import torch; print(f"torch=={torch.__version__}")' >"$pins"
        for peer in flash-attn flashinfer-python; do
            pip install -q --only-binary=:all: -c "$pins" "$peer" ||
                echo "setup: no usable $peer wheel; the benches skip that peer"
        done
        rm -f "$pins"
    fi
    "$venv/bin/python" -c 'import torch, triton, fsd.kernels
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"setup: torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}")'
}

if [ "$setup_only" = 1 ]; then
    has_gpu || { echo "gpu-check --setup-only: no NVIDIA GPU here; nothing to set up"; exit 0; }
    setup
    exit $?
fi

if [ -z "$name" ]; then
    if has_gpu; then
        gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
        name=$(python3 bench/gpu_summary.py slug "${gpu_name:-gpu}" 2>/dev/null || echo gpu)
    else
        name="<gpu>"
    fi
fi
[ -n "$dir" ] || dir=bench/results/gpu-$name
py=$venv/bin/python
gpu_tests=$(grep -rlE 'pytest\.mark\.gpu|^gpu = pytest' tests --include='test_*.py' |
    grep -v 'tests/gpu/test_gpu_parity.py' | sort | tr '\n' ' ')
pytest_args="-q -p no:cacheprovider -m gpu"
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU')
parallel_limit=30 # one GPU: bench/parallel.py only says why it skips
[ "$gpus" -ge 2 ] && parallel_limit=150

# name, limit (s), command: one step per line, run in this order.
steps=(
    "setup|75|bash scripts/gpu-check.sh --setup-only --venv $venv$([ "$peers" = 1 ] || echo ' --no-peers')"
    "kernels|70|$py bench/kernels.py --quick --json $dir/kernels.json"
    "swap|35|$py bench/swap.py --json $dir/swap.json"
    "engine-gpu|90|$py bench/engine_gpu.py --json $dir/engine-gpu.json"
    "parity|60|$py -m pytest $pytest_args --junitxml=$dir/parity.xml tests/gpu/test_gpu_parity.py"
    "hf|70|$py bench/hf_compare.py --device cuda --dtype float16 --shape llama-1b --rounds 2 --new-tokens 32 --json $dir/hf.json"
    "gpu-tests|80|$py -m pytest $pytest_args --junitxml=$dir/gpu-tests.xml $gpu_tests"
    "parallel|$parallel_limit|$py bench/parallel.py --device cuda --out $dir/parallel.json"
)
summary_py=python3
[ -x "$py" ] && summary_py=$py
summary_cmd="$summary_py bench/gpu_summary.py report $dir"
reserve=15 # seconds kept for the summary

print_plan() {
    echo "gpu-check plan (results in $dir/, budget ${budget} s):"
    local i=1 entry
    for entry in "${steps[@]}"; do
        IFS='|' read -r step limit cmd <<<"$entry"
        printf '  %d. %-10s <= %3s s  %s\n' "$i" "$step" "$limit" "$cmd"
        i=$((i + 1))
    done
    printf '  %d. %-10s <= %3s s  %s\n' "$i" summary "$reserve" "$summary_cmd"
    echo "goals: Triton paged decode >= 85% of measured copy bandwidth at batch >= 16 and"
    echo "       context >= 2048, no slower than the best installed peer, a ragged batch"
    echo "       <= 1.1x a uniform one; a decode step during a swap <= 1.15x alone; the step"
    echo "       <= 1.5x its roofline at batch 1 and <= 2x at batch 32 (OPT-1.3B, Llama-1B);"
    echo "       tokens/s >= 3x transformers at batch 1 and >= 2x at batch 32"
}

if [ "$dry_run" = 1 ] || ! has_gpu; then
    has_gpu || echo "gpu-check: no CUDA device here (nvidia-smi lists no GPU); nothing is run."
    [ "$dry_run" = 1 ] && echo "gpu-check: dry run; nothing is run."
    print_plan
    exit 0
fi

mkdir -p "$dir/logs"
: >"$dir/steps.tsv"
print_plan
deadline=$((SECONDS + budget - reserve))
failed=0
for entry in "${steps[@]}"; do
    IFS='|' read -r step limit cmd <<<"$entry"
    left=$((deadline - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        echo "== $step: skipped, the budget is spent"
        printf '%s\tskipped\t0\t0\n' "$step" >>"$dir/steps.tsv"
        continue
    fi
    echo "== $step (limit ${limit} s): $cmd"
    start=$SECONDS
    # shellcheck disable=SC2086  # the command is a word list on purpose
    PYTHONUNBUFFERED=1 timeout --kill-after=5 "$limit" $cmd 2>&1 | tee "$dir/logs/$step.log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\t%s\n' "$step" "$rc" "$((SECONDS - start))" "$limit" >>"$dir/steps.tsv"
    if [ "$rc" != 0 ]; then
        echo "== $step: exit status $rc (124: timed out); log in $dir/logs/$step.log"
        failed=1
        if [ "$step" = setup ]; then
            echo "gpu-check: setup failed; the other steps need its venv"
            break
        fi
    fi
done
echo "== summary"
# shellcheck disable=SC2086  # a word list, as above
timeout "$reserve" $summary_cmd || failed=1
exit "$failed"

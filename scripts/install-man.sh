#!/usr/bin/env bash
# Link the man pages of man/ into VENV/share/man/manN (VENV: .venv unless given), where
# `man fsd` finds them once the venv is activated: man(1) derives VENV/share/man from
# VENV/bin on PATH. Links, not copies: an editable install's pages follow the checkout.
# (A regular `pip install` copies them there itself: pyproject's data-files.)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
for page in man/*.[1-9]; do
    dir="$venv/share/man/man${page##*.}"
    mkdir -p "$dir"
    ln -sfn "$PWD/$page" "$dir/"
done

"""A regular (non-editable) install ships every package: each folder of fsd/, console/
and kernels/ with an __init__.py is in pyproject.toml's package list."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = {"fsd": "fsd", "console": "fsd.console", "kernels": "fsd.kernels"}


def test_every_package_is_listed_for_the_wheel():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for tree, name in TREES.items():
        for init in (ROOT / tree).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / tree).parts
            found.add(".".join([name, *parts]))
    assert found - listed == set(), "packages a wheel would leave out"

"""The README and docs/ a user of a plain clone reads: short, self-contained, current.

- The README starts with the two commands (CI runs the second, exactly), and stays at
  most 400 lines (results and design notes live in docs/).
- No page points outside the repository, and every relative link resolves.
- docs/results.md is what bench/docs.py renders from bench/results/*.json.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_opens_with_the_two_commands_and_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail to docs/"
    head = "\n".join(lines[:8])
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    test_command = ci.split("&&", 1)[0].strip() + " && " + ci.split("&&", 1)[1].strip()
    assert test_command in head, "the README's test command must be the one CI runs"
    assert "bash scripts/setup.sh && .venv/bin/fsd start" in head


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_points_outside_the_repository(page: Path):
    text = page.read_text()
    assert "../shared" not in text and "shared/data" not in text, page.name
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert resolved.exists(), f"{page.name}: {target} does not exist"


def test_results_page_is_rendered_from_the_committed_json():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "docs.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr

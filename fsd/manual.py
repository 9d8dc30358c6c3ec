"""The man pages: finding them (installed package or source checkout) and showing them.

The roff sources live in `man/` of the repository and install as the package data
`fsd.manpages`. `show` hands a page to `man -l` when there is a terminal and a `man`
program; otherwise it prints a plain-text rendering made here, so the pages read
the same on a machine without man (a container, CI, a pipe).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from fsd.errors import ConfigError

# page name → file; fsd-scenario(5) is listed once its file exists
PAGES = {
    "fsd": "fsd.1",
    "fsctl": "fsctl.1",
    "fsd.toml": "fsd.toml.5",
    "fsd-scenario": "fsd-scenario.5",
}


def man_dir() -> Path | None:
    """The directory holding the pages: the installed package data, else the checkout's."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "manpages", here.parent / "man"):  # installed, checkout
        if (candidate / "fsd.1").is_file():
            return candidate
    return None


def available() -> dict[str, Path]:
    """The pages present, by name."""
    root = man_dir()
    if root is None:
        return {}
    return {name: root / file for name, file in PAGES.items() if (root / file).is_file()}


def find(page: str) -> Path:
    """A page by name ("fsd.toml") or file name ("fsd.toml.5"); ConfigError if absent."""
    pages = available()
    name = page.removesuffix(".1").removesuffix(".5")
    if name not in pages:
        known = ", ".join(pages) or "none installed"
        raise ConfigError(f"no man page {page!r}; pages: {known}")
    return pages[name]


def show(page: str, raw: bool = False) -> None:
    """Page `page` to the terminal with man(1), else print it as plain text (or roff)."""
    path = find(page)
    source = path.read_text(encoding="utf-8")
    if raw:
        sys.stdout.write(source)
        return
    man = shutil.which("man")
    # on a terminal man(1) pages and formats; if it fails (no groff), fall back to text
    if man is not None and sys.stdout.isatty() and subprocess.call([man, "-l", str(path)]) == 0:
        return
    sys.stdout.write(to_text(source))


# ---- a small roff → text renderer (the man(7) macros these pages use) ------------

_ESCAPES = [
    (re.compile(r"\\f(\(..|\[[^\]]*\]|.)"), ""),  # font changes
    (re.compile(r"\\\(em|\\\[em\]"), "--"),
    (re.compile(r"\\\(en|\\\[en\]"), "-"),
    (re.compile(r"\\\(aq|\\\[aq\]"), "'"),
    (re.compile(r"\\\(dq|\\\[dq\]"), '"'),
    (re.compile(r"\\\(bu|\\\[bu\]"), "*"),
    (re.compile(r"\\\(mu|\\\[mu\]"), "x"),
    (re.compile(r"\\\(ga|\\\[ga\]"), "`"),
    (re.compile(r"\\\(ti|\\\[ti\]"), "~"),
    (re.compile(r"\\\(ha|\\\[ha\]"), "^"),
    (re.compile(r"\\[&:]"), ""),
    (re.compile(r"\\[-~ ]"), lambda m: "-" if m.group(0) == "\\-" else " "),
    (re.compile(r"\\e"), "\\\\"),
]
_ALTERNATING = {"BR", "RB", "BI", "IB", "IR", "RI"}


def unescape(text: str) -> str:
    """Roff escapes in running text → plain characters."""
    for pattern, repl in _ESCAPES:
        text = pattern.sub(repl, text)
    return text


def _args(rest: str) -> list[str]:
    """Macro arguments: words, or "quoted strings"."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', rest)]


def to_text(source: str, width: int = 78) -> str:
    """A plain-text rendering of a man(7) page: sections flush left, text filled."""
    r = _Renderer(width)
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")) or line in (".", "'"):
            continue
        if not line.startswith((".", "'")):
            r.text(unescape(line))
            continue
        macro, _, rest = line[1:].partition(" ")
        args = _args(rest)
        if macro in ("B", "I", "SM", "SB"):
            r.text(unescape(" ".join(args)))
        elif macro in _ALTERNATING:
            r.text(unescape("".join(args)))
        else:
            r.control(macro, [unescape(a) for a in args], rest)
    return r.result()


class _Renderer:
    """Fills running text into paragraphs; control macros break and indent."""

    BASE = 7

    def __init__(self, width: int) -> None:
        self.width = width
        self.out: list[str] = []
        self.words: list[str] = []
        self.base = self.BASE  # .RS / .RE move it
        self.extra = 0  # the body of a .TP / .IP item
        self.tag_next = False
        self.nofill = False

    def text(self, text: str) -> None:
        if self.nofill:
            self.out.append(" " * (self.base + self.extra) + text if text else "")
        elif self.tag_next:  # the line after .TP is the item's tag
            self.flush()
            self.out.append(" " * self.base + text)
            self.tag_next, self.extra = False, 4
        else:
            self.words += text.split()

    def flush(self) -> None:
        if self.words:
            pad = " " * (self.base + self.extra)
            self.out += textwrap.wrap(
                " ".join(self.words),
                self.width,
                initial_indent=pad,
                subsequent_indent=pad,
                break_on_hyphens=False,
            )
            self.words = []

    def control(self, macro: str, args: list[str], rest: str) -> None:
        self.flush()
        if macro == "TH":
            self.out += [f"{args[0]}({args[1]})" if len(args) > 1 else rest, ""]
        elif macro in ("SH", "SS"):
            self.extra, self.base = 0, self.BASE
            self.out += ["", (" " * 3 if macro == "SS" else "") + " ".join(args)]
        elif macro in ("PP", "P", "LP"):
            self.extra = 0
            self.out.append("")
        elif macro == "sp":
            self.out.append("")
        elif macro == "TP":
            self.out.append("")
            self.tag_next = True
        elif macro == "IP":
            self.out.append("")
            if args:
                self.out.append(" " * self.base + args[0])
            self.extra = 4
        elif macro == "RS":
            self.base += 4
        elif macro == "RE":
            self.base = max(self.BASE, self.base - 4)
        elif macro in ("nf", "EX"):
            self.nofill = True
        elif macro in ("fi", "EE"):
            self.nofill = False
        # .br only breaks (done above); .ad, .na, .hy, .ne change nothing here

    def result(self) -> str:
        self.flush()
        return "\n".join(self.out).strip("\n") + "\n"

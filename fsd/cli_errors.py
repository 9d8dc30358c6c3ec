"""How every fsd command line (`fsd`, `fsd simulate`, `fsctl`) reports a deliberate error.

A deliberate error (an `FsdError`: a bad flag, a config error, no daemon) is one
`error: ...` line on stderr and exit status 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NoReturn

import typer

from fsd.errors import FsdError

EXIT_ERROR = 2


def fail(message: FsdError | str) -> NoReturn:
    """Print one `error:` line on stderr and exit 2.

    The message is printed as it is: never wrapped (scripts and `fsd start` read it)
    and never read as markup (a config error names its `[section]`). On a terminal
    `error:` is bold red; click drops the colour anywhere else.
    """
    typer.echo(f"{typer.style('error:', fg='red', bold=True)} {message}", err=True)
    raise typer.Exit(EXIT_ERROR)


@contextlib.contextmanager
def friendly() -> Iterator[None]:
    """Turn fsd's deliberate errors inside the block into `fail`'s line and exit 2."""
    try:
        yield
    except FsdError as exc:
        fail(exc)

"""The commands both command lines (`fsd`, `fsctl`) have: `version` and `man`.

No `from __future__ import annotations` here: typer evaluates the annotations of the
commands made below, which name this function's locals.
"""

from typing import Annotated

import typer

from fsd.cli_errors import friendly


def add_common_commands(app: typer.Typer, first: str) -> None:
    """Add `version` and `man` to `app`; `man` shows page `first` unless told another."""
    others = [p for p in ("fsd", "fsctl") if p != first]
    pages = f"{first}, {', '.join(others)}, fsd.toml or fsd-scenario."

    @app.command()
    def version() -> None:
        """Print the fsd version."""
        from fsd.version import __version__

        typer.echo(__version__)

    @app.command("man")
    def man_page(
        page: Annotated[str, typer.Argument(help=pages)] = first,
        raw: Annotated[bool, typer.Option(help="Print the roff source.")] = False,
    ) -> None:
        """Show a manual page (with man(1) when there is one, else as plain text)."""
        from fsd import manual

        with friendly():
            manual.show(page, raw)

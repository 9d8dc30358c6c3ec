"""`fsctl`: the operator's command line (daemon commands arrive with the daemon)."""

from __future__ import annotations

import typer

app = typer.Typer(help="fsctl: inspect and steer a running fsd daemon.", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the fsd version."""
    from fsd import __version__

    typer.echo(__version__)


if __name__ == "__main__":
    app()

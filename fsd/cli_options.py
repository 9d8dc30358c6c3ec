"""Command-line options that `fsd` and `fsctl` share: how to reach a daemon's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from fsd.errors import ConfigError

if TYPE_CHECKING:
    from fsd.client import CurveKeys

ServerKey = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at run time
    typer.Option(envvar="FSD_SERVER_KEY", help="CURVE: the daemon's public key file."),
]
ClientKey = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(envvar="FSD_CLIENT_KEY", help="CURVE: this client's .key_secret file."),
]


def curve_keys(server_key: str | None, client_key: str | None) -> CurveKeys | None:
    """The client's CURVE keys from --server-key/--client-key (both or neither)."""
    from fsd.client import CurveKeys

    if server_key is None and client_key is None:
        return None
    if server_key is None or client_key is None:
        raise ConfigError("CURVE needs both --server-key and --client-key")
    return CurveKeys(server_key, None, client_key)

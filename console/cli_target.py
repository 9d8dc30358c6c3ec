"""Where `fsctl` finds the daemon: the global options, as one `Target` every command reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NoReturn, Optional

import typer

from fsd.cli_errors import fail, friendly
from fsd.cli_options import curve_keys, default_of
from fsd.config import ServerConfig

DEFAULT_ENDPOINT = default_of(ServerConfig, "endpoint")
DEFAULT_TELEMETRY = default_of(ServerConfig, "telemetry_endpoint")
DEFAULT_TIMEOUT = 10.0  # seconds fsctl waits for an answer

# the options that say how to reach the daemon and which role to claim
StateDir = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at run time
    typer.Option(
        envvar="FSD_STATE_DIR",
        help="The daemon's state folder, where its operator token is (default "
        f"{default_of(ServerConfig, 'state_dir')}).",
    ),
]
TokenFile = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        envvar="FSD_TOKEN_FILE",
        help="Operator token file (default: the daemon's, in --state-dir). FSD_TOKEN gives "
        "the token itself.",
    ),
]


@dataclass(frozen=True)
class Target:
    """Where the daemon is and how to reach it (the global options)."""

    endpoint: str
    telemetry_endpoint: str
    timeout: float
    server_key: str | None
    client_key: str | None
    state_dir: str | None = None
    token_file: str | None = None

    def curve(self):  # -> fsd.client.CurveKeys | None
        with friendly():
            return curve_keys(self.server_key, self.client_key)

    def token(self) -> str | None:
        """The operator token: FSD_TOKEN, --token-file, or the daemon's file in --state-dir
        (None: this user cannot read one, so requests have the client role)."""
        from fsd.credentials import find_operator_token

        return find_operator_token(self.endpoint, self.state_dir, self.token_file)

    def check_daemon(self) -> None:
        """DaemonUnavailable at once when no daemon can answer at a local endpoint
        (`fsd.local_daemon`), not after --timeout."""
        from fsd.local_daemon import check_daemon

        check_daemon(self.endpoint, self.state_dir, self.timeout)

    def client(self):  # -> fsd.client.Client
        from fsd.client import Client

        curve, token = self.curve(), self.token()  # a bad option is said first
        self.check_daemon()
        return Client(self.endpoint, timeout=self.timeout, curve=curve, token=token)

    def telemetry(self, snapshots: bool, events: bool):  # -> fsd.client.TelemetryClient
        from fsd.client import TelemetryClient

        return TelemetryClient(
            self.telemetry_endpoint, snapshots=snapshots, events=events, curve=self.curve()
        )

    def no_telemetry(self) -> NoReturn:
        """Exit 2: no telemetry came within --timeout."""
        fail(
            f"no telemetry from {self.telemetry_endpoint} within {self.timeout:g} s "
            "(is the daemon running? is telemetry_hz > 0?)"
        )


def target_of(ctx: typer.Context) -> Target:
    """The global options of this call (set by `fsctl`'s callback, which runs first)."""
    return ctx.obj

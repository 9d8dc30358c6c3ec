"""`fsctl`: the operator's command line for a running fsd daemon.

Every command talks to the daemon through `fsd.client`; any failure (no daemon,
an `Error` reply, a bad argument) is one `error: ...` line on stderr and exit 2
(`fsd.cli_errors`). The commands live by subject: jobs in `cli_jobs`, telemetry in
`cli_telemetry`; the global options make the `Target` of `cli_target`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fsd.cli_common import add_common_commands
from fsd.cli_errors import fail, friendly
from fsd.cli_options import ClientKey, ServerKey, version_option
from fsd.console import cli_jobs, cli_telemetry
from fsd.console.cli_target import (
    DEFAULT_ENDPOINT,
    DEFAULT_TELEMETRY,
    DEFAULT_TIMEOUT,
    StateDir,
    Target,
    TokenFile,
    target_of,
)

app = typer.Typer(
    help="fsctl: inspect and steer a running fsd daemon.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    endpoint: Annotated[
        str, typer.Option(envvar="FSD_ENDPOINT", help="The daemon's request socket.")
    ] = DEFAULT_ENDPOINT,
    telemetry_endpoint: Annotated[
        str, typer.Option(envvar="FSD_TELEMETRY_ENDPOINT", help="The daemon's telemetry socket.")
    ] = DEFAULT_TELEMETRY,
    timeout: Annotated[
        float, typer.Option(envvar="FSD_TIMEOUT", help="Seconds to wait for an answer.")
    ] = DEFAULT_TIMEOUT,
    server_key: ServerKey = None,
    client_key: ClientKey = None,
    state_dir: StateDir = None,
    token_file: TokenFile = None,
    version: Annotated[Optional[bool], version_option("fsctl")] = None,  # noqa: UP045
) -> None:
    """fsctl: inspect and steer a running fsd daemon."""
    if timeout <= 0:
        fail(f"--timeout must be > 0 seconds, got {timeout}")
    ctx.obj = Target(
        endpoint, telemetry_endpoint, timeout, server_key, client_key, state_dir, token_file
    )


add_common_commands(app, "fsctl")


for command in (cli_jobs.status, cli_jobs.submit, cli_jobs.jobs, cli_jobs.job, cli_jobs.abort,
                cli_jobs.retune, cli_jobs.inject):
    app.command()(command)


@app.command()
def play(
    ctx: typer.Context,
    scenario: Annotated[Path, typer.Argument(help="A scenario TOML file (man fsd-scenario).")],
    time_scale: Annotated[
        float, typer.Option(help="Play S times faster: every time divided by S, same jobs.")
    ] = 1.0,
    length_scale: Annotated[
        float, typer.Option(help="Multiply every job's token counts (small models, CPU).")
    ] = 1.0,
    duration: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Cut (or extend) the scenario to this many seconds."),
    ] = None,
    records: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Per-job records, JSON Lines (default play-NAME.jsonl)."),
    ] = None,
    json_out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--json", help="Also write the summary and KV series as JSON."),
    ] = None,
    tag: Annotated[str, typer.Option(help="Tag of the played jobs.")] = "play",
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for jobs after the last arrival.")
    ] = 300.0,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = True,
) -> None:
    """Play SCENARIO against the daemon in real time; write per-job records, print a summary."""
    from fsd.console.play import PlayOptions, run_play_command

    target = target_of(ctx)
    with friendly():
        opts = PlayOptions(
            time_scale=time_scale,
            length_scale=length_scale,
            duration=duration,
            tag=tag,
            drain_timeout=drain_timeout,
            progress=progress,
        )
        run_play_command(
            scenario,
            target.endpoint,
            target.telemetry_endpoint,
            opts,
            records,
            json_out,
            target.timeout,
            target.curve(),
            token=target.token(),
        )


@app.command()
def drain(
    ctx: typer.Context,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds the daemon waits for in-flight jobs.")
    ] = 30.0,
    replica: Annotated[
        Optional[int],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option(help="Drain one replica of several: its jobs move to the others."),
    ] = None,
) -> None:
    """Stop accepting jobs and wait for the in-flight ones to end (--replica: move one
    replica's jobs to the others instead)."""
    with friendly(), target_of(ctx).client() as c:
        detail = c.drain(timeout=drain_timeout, replica=replica)
    typer.echo(f"drain: {_detail(detail)}")


@app.command()
def undrain(
    ctx: typer.Context,
    replica: Annotated[
        Optional[int],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option(help="Let this drained replica take jobs again."),
    ] = None,
) -> None:
    """Accept new jobs again after `fsctl drain` (operator)."""
    with friendly(), target_of(ctx).client() as c:
        detail = c.undrain(replica=replica)
    typer.echo(f"undrain: {_detail(detail)}")


@app.command()
def shutdown(
    ctx: typer.Context,
    drain: Annotated[bool, typer.Option(help="Let in-flight jobs end first.")] = True,
    drain_timeout: Annotated[float, typer.Option(help="Seconds to wait for them.")] = 30.0,
) -> None:
    """Stop the daemon (after draining, by default)."""
    with friendly(), target_of(ctx).client() as c:
        detail = c.shutdown(drain=drain, timeout=drain_timeout)
    typer.echo(f"shutdown: {_detail(detail)}")


def _detail(detail: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in detail.items()) or "ok"


for command in (cli_telemetry.watch, cli_telemetry.record, cli_telemetry.top):
    app.command()(command)


if __name__ == "__main__":
    app()

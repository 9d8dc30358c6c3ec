"""`fsctl`: the operator's command line for a running fsd daemon.

Every command talks to the daemon through `fsd.client`; any failure (no daemon,
an `Error` reply, a bad argument) is one `error: ...` line on stderr and exit 2.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import msgspec
import typer

from fsd.cli_options import ClientKey, ServerKey, curve_keys
from fsd.console import cli_format as fmt
from fsd.errors import FsdError

app = typer.Typer(
    help="fsctl: inspect and steer a running fsd daemon.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
_DEFAULT_TELEMETRY = "tcp://127.0.0.1:5558"


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

    def client(self):  # -> fsd.client.Client
        from fsd.client import Client

        return Client(self.endpoint, timeout=self.timeout, curve=self.curve(), token=self.token())

    def telemetry(self, snapshots: bool, events: bool):  # -> fsd.client.TelemetryClient
        from fsd.client import TelemetryClient

        return TelemetryClient(
            self.telemetry_endpoint, snapshots=snapshots, events=events, curve=self.curve()
        )


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def friendly() -> Iterator[None]:
    """Turn fsd's deliberate errors into one line and exit status 2."""
    try:
        yield
    except FsdError as exc:
        fail(str(exc))


def _target(ctx: typer.Context) -> Target:
    return ctx.obj  # set by `main`, which runs before every command


# the options that say how to reach the daemon and which role to claim
_StateDir = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        envvar="FSD_STATE_DIR",
        help="The daemon's state folder, where its operator token is (default "
        "~/.local/state/fsd).",
    ),
]
_TokenFile = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        envvar="FSD_TOKEN_FILE",
        help="Operator token file (default: the daemon's, in --state-dir). FSD_TOKEN gives "
        "the token itself.",
    ),
]


@app.callback()
def main(
    ctx: typer.Context,
    endpoint: Annotated[
        str, typer.Option(envvar="FSD_ENDPOINT", help="The daemon's request socket.")
    ] = _DEFAULT_ENDPOINT,
    telemetry_endpoint: Annotated[
        str, typer.Option(envvar="FSD_TELEMETRY_ENDPOINT", help="The daemon's telemetry socket.")
    ] = _DEFAULT_TELEMETRY,
    timeout: Annotated[
        float, typer.Option(envvar="FSD_TIMEOUT", help="Seconds to wait for an answer.")
    ] = 10.0,
    server_key: ServerKey = None,
    client_key: ClientKey = None,
    state_dir: _StateDir = None,
    token_file: _TokenFile = None,
) -> None:
    """fsctl: inspect and steer a running fsd daemon."""
    if timeout <= 0:
        fail(f"--timeout must be > 0 seconds, got {timeout}")
    ctx.obj = Target(
        endpoint, telemetry_endpoint, timeout, server_key, client_key, state_dir, token_file
    )


def _json(obj: object) -> None:
    typer.echo(msgspec.json.encode(obj).decode())


@app.command()
def version() -> None:
    """Print the fsd version."""
    from fsd import __version__

    typer.echo(__version__)


@app.command("man")
def man_page(
    page: Annotated[str, typer.Argument(help="fsctl, fsd, fsd.toml or fsd-scenario.")] = "fsctl",
    raw: Annotated[bool, typer.Option(help="Print the roff source.")] = False,
) -> None:
    """Show a manual page (with man(1) when there is one, else as plain text)."""
    from fsd import manual

    with friendly():
        manual.show(page, raw)


@app.command()
def status(
    ctx: typer.Context,
    json: Annotated[bool, typer.Option("--json", help="Print the reply as JSON.")] = False,
) -> None:
    """Show the daemon's model, policy, load and health."""
    with friendly(), _target(ctx).client() as c:
        reply = c.status()
    if json:
        _json(reply)
    else:
        for line in fmt.status_lines(reply):
            typer.echo(line)


@app.command()
def submit(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="Prompt text.")],
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    seed: Annotated[Optional[int], typer.Option(help="Seed of this job's draws.")] = None,  # noqa: UP045
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,  # noqa: UP045
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = False,
    min_tokens: Annotated[int, typer.Option(help="Fewest tokens before EOS may stop.")] = 0,
    tag: Annotated[Optional[list[str]], typer.Option(help="Tag the job (repeatable).")] = None,  # noqa: UP045
    stats: Annotated[bool, typer.Option(help="Print timings and counts to stderr.")] = False,
) -> None:
    """Submit PROMPT to the daemon and stream the generated text to stdout."""
    sampling = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "stop": tuple(stop or ()),
        "ignore_eos": ignore_eos,
        "min_tokens": min_tokens,
    }
    with friendly(), _target(ctx).client() as c:
        handle = c.submit(prompt, tags=tag or (), **sampling)
        try:
            for chunk in handle:
                typer.echo(chunk.text, nl=False)
        except KeyboardInterrupt:
            with contextlib.suppress(FsdError):
                handle.abort()
            typer.echo(f"\naborted {handle.req_id}", err=True)
            raise typer.Exit(130) from None
        result = handle.result()
    typer.echo("")
    if stats:
        typer.echo(fmt.completion_stats(result), err=True)
    if result.finish_reason == "error":
        fail(f"{result.job_id} ended with an error")
    if result.finish_reason == "abort":
        typer.echo(f"{result.job_id} was aborted", err=True)
        raise typer.Exit(1)


@app.command()
def jobs(
    ctx: typer.Context,
    json: Annotated[bool, typer.Option("--json", help="Print the jobs as JSON.")] = False,
) -> None:
    """List the daemon's live jobs: queue level, state, KV location, ENST, tokens."""
    from rich.console import Console

    with friendly(), _target(ctx).client() as c:
        listed = c.jobs()
    if json:
        _json(listed)
    elif not listed:
        typer.echo("no jobs")
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(fmt.jobs_table(listed))


@app.command()
def job(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="A job id, as `fsctl jobs` shows it.")],
    json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Show one job in detail."""
    with friendly(), _target(ctx).client() as c:
        info = c.job(job_id)
    if json:
        _json(info)
    else:
        for line in fmt.job_lines(info):
            typer.echo(line)


@app.command()
def abort(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job to stop.")],
) -> None:
    """Abort a job; its client receives it finished with reason "abort"."""
    with friendly(), _target(ctx).client() as c:
        c.abort(job_id)
    typer.echo(f"aborted {job_id}")


@app.command()
def retune(
    ctx: typer.Context,
    settings: Annotated[
        list[str], typer.Argument(help="KEY=VALUE ..., e.g. policy=fcfs quanta=0.01,0.02,0.04")
    ],
) -> None:
    """Change scheduling settings live; prints each setting's new value."""
    with friendly():
        changes = fmt.parse_assignments(settings)
        with _target(ctx).client() as c:
            config = c.retune(**changes)
    for key, requested in changes.items():
        found, value = fmt.find_setting(config, key)
        value = value if found else requested
        shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else value
        shown = "none (the default)" if shown is None else shown
        typer.echo(f"{key} = {shown}")


@app.command()
def inject(
    ctx: typer.Context,
    count: Annotated[Optional[int], typer.Option(help="Jobs in the burst.")] = None,  # noqa: UP045
    input_len: Annotated[Optional[int], typer.Option(help="Prompt tokens each.")] = None,  # noqa: UP045
    output_len: Annotated[Optional[int], typer.Option(help="Output tokens each.")] = None,  # noqa: UP045
    scenario: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="A scenario TOML file to play instead of a burst."),
    ] = None,
    tag: Annotated[str, typer.Option(help="Tag of the injected jobs.")] = "injected",
    wait: Annotated[
        bool,
        typer.Option(
            help="Stay until the jobs end (they are this connection's: the daemon aborts "
            "them when it goes away; Ctrl-C aborts them)."
        ),
    ] = True,
) -> None:
    """Inject a burst of tagged jobs (--count/--input-len/--output-len) or a scenario.

    The scenario file and the traces it names are read here and sent inline. The jobs
    belong to this connection, as submitted ones do: fsctl waits for them (--no-wait
    leaves at once, and the daemon then aborts them after its client_timeout).
    """
    target = _target(ctx)
    burst = (count, input_len, output_len)
    if scenario is not None and any(v is not None for v in burst):
        fail("give either --scenario or --count/--input-len/--output-len, not both")
    if scenario is None and any(v is None for v in burst):
        fail("inject needs --count, --input-len and --output-len (or --scenario FILE)")
    with friendly(), target.client() as c:
        if scenario is not None:
            ids = c.inject(scenario=scenario, tag=tag)
        else:
            ids = c.inject(burst=burst, tag=tag)  # type: ignore[arg-type]
        typer.echo(fmt.injected_summary(ids, tag))
        if wait and ids:
            _wait_injected(c, ids)


def _wait_injected(client, ids: list[str]) -> None:  # noqa: ANN001 - fsd.client.Client
    """Count the injected jobs down as they end; Ctrl-C aborts the rest (exit 130)."""
    from collections import Counter

    reasons: Counter[str] = Counter()
    typer.echo(f"waiting for {len(ids)} jobs (Ctrl-C aborts them)", err=True)
    try:
        for fin in client.wait_injected(ids).values():
            reasons[fin.reason] += 1
    except KeyboardInterrupt:
        typer.echo("interrupted: the injected jobs still running are aborted", err=True)
        raise typer.Exit(130) from None
    typer.echo("ended: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))


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

    target = _target(ctx)
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
) -> None:
    """Stop accepting jobs and wait for the in-flight ones to end."""
    with friendly(), _target(ctx).client() as c:
        detail = c.drain(timeout=drain_timeout)
    typer.echo(f"drain: {_detail(detail)}")


@app.command()
def undrain(ctx: typer.Context) -> None:
    """Accept new jobs again after `fsctl drain` (operator)."""
    with friendly(), _target(ctx).client() as c:
        detail = c.undrain()
    typer.echo(f"undrain: {_detail(detail)}")


@app.command()
def shutdown(
    ctx: typer.Context,
    drain: Annotated[bool, typer.Option(help="Let in-flight jobs end first.")] = True,
    drain_timeout: Annotated[float, typer.Option(help="Seconds to wait for them.")] = 30.0,
) -> None:
    """Stop the daemon (after draining, by default)."""
    with friendly(), _target(ctx).client() as c:
        detail = c.shutdown(drain=drain, timeout=drain_timeout)
    typer.echo(f"shutdown: {_detail(detail)}")


def _detail(detail: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in detail.items()) or "ok"


_EVENTS = typer.Option("--events", help="Only events (default: events and snapshots).")
_SNAPSHOTS = typer.Option("--snapshots", help="Only snapshots (default: both).")


@app.command()
def watch(
    ctx: typer.Context,
    events: Annotated[bool, _EVENTS] = False,
    snapshots: Annotated[bool, _SNAPSHOTS] = False,
    count: Annotated[Optional[int], typer.Option(help="Stop after this many lines.")] = None,  # noqa: UP045
) -> None:
    """Print the daemon's telemetry, one line per snapshot or event (Ctrl-C stops)."""
    target = _target(ctx)
    want_snap, want_events = (snapshots, events) if snapshots or events else (True, True)
    with friendly(), target.telemetry(want_snap, want_events) as tc:
        shown = 0
        with contextlib.suppress(KeyboardInterrupt):
            while count is None or shown < count:
                # Snapshots come several times a second: none at first means no daemon.
                first = shown == 0 and want_snap
                msg = tc.recv(timeout=target.timeout if first else None)
                if msg is None:
                    _no_telemetry(target)
                typer.echo(fmt.telemetry_line(msg))
                shown += 1


@app.command()
def record(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Recording to append to (JSON Lines).")],
    duration: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Seconds to record (default: until Ctrl-C)."),
    ] = None,
    events: Annotated[bool, _EVENTS] = False,
    snapshots: Annotated[bool, _SNAPSHOTS] = False,
) -> None:
    """Record telemetry to FILE for replay (`fsd.client.read_recording`, `fsctl top --replay`)."""
    from fsd.client import RecordingWriter

    target = _target(ctx)
    want_snap, want_events = (snapshots, events) if snapshots or events else (True, True)
    counts = {"snapshot": 0, "event": 0}
    writer = None
    start = time.monotonic()
    end = None if duration is None else start + duration
    with friendly(), target.telemetry(want_snap, want_events) as tc:
        try:
            while end is None or time.monotonic() < end:
                waits = [] if end is None else [end - time.monotonic()]
                if writer is None and want_snap:
                    waits.append(start + target.timeout - time.monotonic())
                frame = tc.recv_frame(max(0.0, min(waits)) if waits else None)
                if frame is None:
                    if writer is None and want_snap and time.monotonic() - start >= target.timeout:
                        _no_telemetry(target)
                    continue
                if writer is None:  # created on the first frame: no empty files
                    writer = RecordingWriter(file, endpoint=target.telemetry_endpoint)
                writer.write(frame)
                counts[frame.topic] += 1
        except KeyboardInterrupt:
            pass
        finally:
            if writer is not None:
                writer.close()
    total = counts["snapshot"] + counts["event"]
    typer.echo(
        f"recorded {total} frames ({counts['snapshot']} snapshots, {counts['event']} events) "
        f"in {time.monotonic() - start:.1f} s to {file}",
        err=True,
    )


@app.command()
def top(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    replay: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Play a recording from `fsctl record` instead of a live daemon."),
    ] = None,
    hz: Annotated[float, typer.Option(help="Screen refreshes per second, at most.")] = 4.0,
    speed: Annotated[float, typer.Option(help="Replay pace (2 = twice as fast, 0 = at once).")] = 1.0,  # fmt: skip
) -> None:
    """The live operator console: queues, jobs, KV, SLO, and levers to change them."""
    if hz <= 0:
        fail(f"--hz must be > 0, got {hz}")
    if speed < 0:
        fail(f"--speed must be >= 0, got {speed}")
    target = _target(ctx)
    from fsd.console.top import run

    with friendly():
        run(
            target.endpoint,
            target.telemetry_endpoint,
            timeout=target.timeout,
            curve=target.curve(),
            token=None if replay is not None else target.token(),
            once=once,
            replay=replay,
            hz=hz,
            speed=speed,
        )


def _no_telemetry(target: Target) -> NoReturn:
    fail(
        f"no telemetry from {target.telemetry_endpoint} within {target.timeout:g} s "
        "(is the daemon running? is telemetry_hz > 0?)"
    )


if __name__ == "__main__":
    app()

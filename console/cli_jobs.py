"""`fsctl` commands about jobs: status, submit, jobs, job, abort, retune, inject.

Plain functions; `console/cli.py` registers them on the `fsctl` app.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Optional, TypeVar

import msgspec
import typer

from fsd import protocol as P
from fsd.cli_errors import fail, friendly
from fsd.cli_options import CLI_MAX_TOKENS, default_of
from fsd.console import cli_format as fmt
from fsd.console.cli_target import target_of
from fsd.console.preview_format import preview_lines
from fsd.errors import FsdError

T = TypeVar("T")


def _json(obj: object) -> None:
    typer.echo(msgspec.json.encode(obj).decode())


def _print(reply: T, json: bool, lines: Callable[[T], Iterable[str]]) -> None:
    """A reply as JSON, or as the `lines` the terminal reads."""
    if json:
        _json(reply)
    else:
        for line in lines(reply):
            typer.echo(line)


def status(
    ctx: typer.Context,
    json: Annotated[bool, typer.Option("--json", help="Print the reply as JSON.")] = False,
) -> None:
    """Show the daemon's model, policy, load and health."""
    with friendly(), target_of(ctx).client() as c:
        reply = c.status()
    _print(reply, json, fmt.status_lines)


def submit(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="Prompt text.")],
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = CLI_MAX_TOKENS,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = default_of(
        P.Sampling, "temperature"
    ),
    top_k: Annotated[
        int, typer.Option(help="Keep the k most likely tokens (0 = all).")
    ] = default_of(P.Sampling, "top_k"),
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = default_of(
        P.Sampling, "top_p"
    ),
    seed: Annotated[int | None, typer.Option(help="Seed of this job's draws.")] = default_of(
        P.Sampling, "seed"
    ),
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = default_of(
        P.Sampling, "ignore_eos"
    ),
    min_tokens: Annotated[
        int, typer.Option(help="Fewest tokens before EOS may stop.")
    ] = default_of(P.Sampling, "min_tokens"),
    tag: Annotated[list[str] | None, typer.Option(help="Tag the job (repeatable).")] = None,
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
    with friendly(), target_of(ctx).client() as c:
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


def jobs(
    ctx: typer.Context,
    json: Annotated[bool, typer.Option("--json", help="Print the jobs as JSON.")] = False,
) -> None:
    """List the daemon's live jobs: queue level, state, KV location, ENST, tokens."""
    from rich.console import Console

    with friendly(), target_of(ctx).client() as c:
        listed = c.jobs()
    if json:
        _json(listed)
    elif not listed:
        typer.echo("no jobs")
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(fmt.jobs_table(listed))


def job(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="A job id, as `fsctl jobs` shows it.")],
    json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Show one job in detail."""
    with friendly(), target_of(ctx).client() as c:
        info = c.job(job_id)
    _print(info, json, fmt.job_lines)


def abort(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job to stop.")],
) -> None:
    """Abort a job; its client receives it finished with reason "abort"."""
    with friendly(), target_of(ctx).client() as c:
        c.abort(job_id)
    typer.echo(f"aborted {job_id}")


def retune(
    ctx: typer.Context,
    settings: Annotated[
        list[str], typer.Argument(help="KEY=VALUE ..., e.g. policy=fcfs quanta=0.01,0.02,0.04")
    ],
    preview: Annotated[
        bool,
        typer.Option(
            "--preview",
            help="Apply nothing: run the daemon's twin forward under the current settings "
            "and under these, and print both.",
        ),
    ] = False,
    horizon: Annotated[
        float, typer.Option(help="With --preview: seconds of simulated time.")
    ] = default_of(P.Preview, "horizon"),
    seeds: Annotated[
        int, typer.Option(help="With --preview: runs (arrival draws) per side.")
    ] = default_of(P.Preview, "seeds"),
    replica: Annotated[
        Optional[int],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option(help="A daemon of several replicas: retune this one only (default: all)."),
    ] = None,
) -> None:
    """Change scheduling settings live; prints each setting's new value (--preview: what
    they would do, applying nothing)."""
    with friendly():
        changes = fmt.parse_assignments(settings)
        with target_of(ctx).client() as c:
            if preview:
                from fsd.progress import Progress

                with Progress(f"previewing... (runs the twin for {horizon:g} s of simulated time)"):  # fmt: skip
                    reply = c.preview(horizon=horizon, seeds=seeds, **changes)
            else:
                config = c.retune(replica=replica, **changes)
    if preview:
        for line in preview_lines(reply):
            typer.echo(line)
        return
    for key, requested in changes.items():
        found, value = fmt.find_setting(config, key)
        value = value if found else requested
        shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else value
        shown = "none (the default)" if shown is None or value == [] else shown
        typer.echo(f"{key} = {shown}")


def inject(
    ctx: typer.Context,
    count: Annotated[int | None, typer.Option(help="Jobs in the burst.")] = None,
    input_len: Annotated[int | None, typer.Option(help="Prompt tokens each.")] = None,
    output_len: Annotated[int | None, typer.Option(help="Output tokens each.")] = None,
    scenario: Annotated[
        Path | None,
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
    target = target_of(ctx)
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


def _wait_injected(client, ids: list[str]) -> None:  # client: fsd.client.Client
    """Count the injected jobs down as they end (a bar on a terminal, lines in a log);
    Ctrl-C aborts the rest (exit 130)."""
    from collections import Counter

    from fsd.progress import Progress

    reasons: Counter[str] = Counter()
    try:
        with Progress(f"waiting for {len(ids)} jobs (Ctrl-C aborts them)", len(ids)) as bar:
            ended = client.wait_injected(ids, on_progress=bar.update)
        for fin in ended.values():
            reasons[fin.reason] += 1
    except KeyboardInterrupt:
        typer.echo("interrupted: the injected jobs still running are aborted", err=True)
        raise typer.Exit(130) from None
    typer.echo("ended: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))

"""`fsctl play`: play a scenario against a running daemon in real time.

The scenario is expanded (`fsd.workload.timeline`) into the same jobs the simulator
and `Inject` see; each arrival is submitted when its time comes (random token ids of
the scenario's prompt length, `max_tokens` = its output length, EOS ignored, so the
lengths are exact), retunes are sent, abort-all aborts this player's live jobs. The
daemon's telemetry is recorded alongside for the KV series and the latency split.
After the last arrival the player waits up to `drain_timeout` for its jobs, then
aborts the rest. One asyncio loop does all of it; bench/slo.py calls `play` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from fsd.client import AsyncClient, AsyncTelemetryClient, CurveKeys
from fsd.console.play_stats import SPLIT, JobRecord, split_latency, summarize
from fsd.console.play_telemetry import TelemetryLog, record
from fsd.errors import FsdError
from fsd.progress import Progress
from fsd.workload.feed import TimelineFeed, walk
from fsd.workload.length_models import clip_lengths
from fsd.workload.prompts import random_prompt
from fsd.workload.scenario import Scenario
from fsd.workload.timeline import Action, Arrival, Timeline, expand


@dataclass(frozen=True)
class PlayOptions:
    """How to play: speed, token scaling, rate, and how long to wait for stragglers."""

    time_scale: float = 1.0  # 2 = twice as fast (the same jobs)
    length_scale: float = 1.0
    rate_factor: float = 1.0  # every phase's rate times this (bench sweeps)
    duration: float | None = None  # cut or extend the scenario
    tag: str = "play"
    drain_timeout: float = 300.0
    slo: float | None = None  # default: the daemon's, from telemetry
    progress: bool = True
    vocab: int = 256  # prompt token ids are drawn from [1, vocab)


@dataclass
class PlayResult:
    """One play: the jobs, what telemetry saw, and the summary row."""

    scenario: str
    timeline: Timeline
    records: list[JobRecord]
    telemetry: TelemetryLog
    started: float
    wall_s: float
    actions: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def prepare(scenario: Scenario, opts: PlayOptions) -> Timeline:
    """The timeline `opts` makes of `scenario`."""
    s = scenario.scaled(opts.time_scale, opts.length_scale)
    if opts.duration is not None:
        s = s.with_duration(opts.duration)
    if opts.rate_factor != 1.0:
        s = s.with_rate_factor(opts.rate_factor)
    return expand(s)


def play(
    timeline: Timeline,
    endpoint: str,
    telemetry_endpoint: str,
    opts: PlayOptions = PlayOptions(),
    *,
    timeout: float = 10.0,
    curve: CurveKeys | None = None,
    console: Console | None = None,
    token: str | None = None,
    label: str | None = None,
) -> PlayResult:
    """Play `timeline` against the daemon at `endpoint` (blocking).

    `token`: the daemon's operator token, which the scenario's retune and inject events
    need (without it the daemon refuses them and the summary lists them as failed).
    `label`: the progress's (default: the scenario's name).
    """
    return asyncio.run(
        _play(timeline, endpoint, telemetry_endpoint, opts, timeout, curve, console, token, label)
    )


async def _play(
    timeline: Timeline,
    endpoint: str,
    telemetry_endpoint: str,
    opts: PlayOptions,
    timeout: float,
    curve: CurveKeys | None,
    console: Console | None,
    token: str | None = None,
    label: str | None = None,
) -> PlayResult:
    """Play `timeline` against the daemon while recording its telemetry."""
    records = [
        JobRecord(i, a.origin, a.time, a.prompt_len, a.output_len)
        for i, a in enumerate(timeline.arrivals)
    ]
    tlog = TelemetryLog()
    live: dict[int, Any] = {}
    actions: list[dict[str, Any]] = []
    async with AsyncClient(endpoint, timeout=timeout, curve=curve, token=token) as client:
        # no daemon: DaemonUnavailable now, not at the first job; and the context
        _clip(records, (await client.status()).max_model_len or None)
        tel = AsyncTelemetryClient(telemetry_endpoint, curve=curve)
        stop = asyncio.Event()
        tel_task = asyncio.create_task(record(tel, tlog, stop))
        progress = _progress(console, opts.progress, label or timeline.name, len(records))
        rng = np.random.default_rng(0)
        loop = asyncio.get_running_loop()
        t0, started = loop.time(), time.time()
        jobs: list[asyncio.Task[None]] = []
        sent = 0

        def show() -> None:
            done = sum(1 for r in records if r.reason is not None)
            info = (
                f"sent {sent}  live {len(live)}  {loop.time() - t0:.0f}/{timeline.duration:.0f} s"
            )
            if progress is not None:
                progress.update(done, info=info)

        with progress or contextlib.nullcontext():
            ticker = asyncio.create_task(_tick(show))
            async def take(step: Arrival | Action) -> None:
                nonlocal sent
                if isinstance(step, Arrival):
                    sent += 1
                    jobs.append(await _submit(client, records[sent - 1], rng, opts, live))
                else:
                    actions.append(await _act(client, step, live, loop.time() - t0))

            try:  # the daemon's injector takes the steps of the same feed
                await walk(TimelineFeed(timeline, t0, prefix="", tag=opts.tag), take, loop.time)
                await _drain(client, jobs, live, opts.drain_timeout, timeout)
            finally:
                ticker.cancel()
                show()
                stop.set()
                await tel_task
                tel.close()
    return _result(timeline, records, tlog, started, actions, opts.slo)


def _clip(records: list[JobRecord], context: int | None) -> None:
    """Clip each job to the daemon's `context`, as the injector and the simulator do."""
    for rec in records:
        p, o = clip_lengths(np.array([rec.prompt_len]), np.array([rec.output_len]), context)
        rec.prompt_len, rec.output_len = int(p[0]), int(o[0])


def _result(
    timeline: Timeline,
    records: list[JobRecord],
    tlog: TelemetryLog,
    started: float,
    actions: list[dict[str, Any]],
    slo: float | None,
) -> PlayResult:
    """The played jobs with their latency split and summary (`slo`: the daemon's if None)."""
    wall = time.time() - started
    split_latency(records, tlog.iterations, tlog.swap_in)
    result = PlayResult(timeline.name, timeline, records, tlog, started, wall, actions)
    result.summary = summarize(records, slo if slo is not None else tlog.slo)
    return result


async def _submit(
    client: Any, rec: JobRecord, rng: np.random.Generator, opts: PlayOptions, live: dict[int, Any]
) -> asyncio.Task[None]:
    """Submit one arrival's job (random prompt ids, EOS ignored) and start following it."""
    prompt = random_prompt(rng, rec.prompt_len, opts.vocab)
    handle = await client.submit(
        prompt, max_tokens=rec.output_len, ignore_eos=True, tags=[opts.tag]
    )
    return asyncio.create_task(_follow(handle, rec, live))


async def _drain(
    client: Any,
    jobs: list[asyncio.Task[None]],
    live: dict[int, Any],
    drain_timeout: float,
    timeout: float,
) -> None:
    """Wait up to `drain_timeout` for the jobs; abort the stragglers and collect their
    (aborted) results."""
    if jobs:
        _, pending = await asyncio.wait(jobs, timeout=drain_timeout)
        if pending:
            await _abort_live(client, live)
            await asyncio.wait(pending, timeout=timeout)


def _progress(console: Console | None, enabled: bool, label: str, total: int) -> Progress | None:
    """Jobs done of `total` on `console`'s stream (stderr): a bar, or lines in a log."""
    if not enabled:
        return None
    return Progress(label, total, stream=console.file if console is not None else None)


async def _tick(show: Any) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            show()
            await asyncio.sleep(0.25)


async def _follow(handle: Any, rec: JobRecord, live: dict[int, Any]) -> None:
    """Wait for one job's end and fill its record."""
    live[rec.index] = handle
    try:
        out = await handle.result()
    except FsdError as exc:  # refused (e.g. prompt too long for this model)
        rec.reason, rec.error = "error", str(exc)
        return
    finally:
        live.pop(rec.index, None)
    t = out.timings
    rec.job_id, rec.reason, rec.tokens = out.job_id, out.finish_reason, len(out.token_ids)
    rec.arrival, rec.first_token, rec.finish = t.arrival, t.first_token, t.finish
    rec.token_times = list(t.token_times)
    rec.preemptions, rec.swaps_out = out.preemptions, out.swaps_out
    rec.swaps_in, rec.recomputes = out.swaps_in, out.recomputes


async def _act(client: Any, action: Action, live: dict[int, Any], at: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"at": at, "kind": action.kind, "changes": action.changes}
    try:
        if action.kind == "retune":
            await client.retune(**action.changes)
        else:
            entry["aborted"] = await _abort_live(client, live)
        entry["ok"] = True
    except FsdError as exc:  # a refused retune is reported; the play goes on
        entry["ok"], entry["error"] = False, str(exc)
    return entry


async def _abort_live(client: Any, live: dict[int, Any]) -> int:
    aborted = 0
    for handle in list(live.values()):
        with contextlib.suppress(FsdError):
            await client.abort(await handle.accepted())
            aborted += 1
    return aborted


# ---- output ------------------------------------------------------------------------


def write_records(path: Path, result: PlayResult) -> None:
    """One JSON object per job (JSON Lines), in arrival order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in result.records:
            f.write(json.dumps(r.to_dict(), default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer | np.floating):
        return x.item()
    return str(x)


def _ms(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.1f}"


def summary_table(rows: dict[str, dict[str, Any]], title: str) -> Table:
    """Rows keyed by a label (a scenario or a policy): the issue's summary columns."""
    table = Table(title=title)
    cols = (
        "",
        "jobs",
        "avg ms/tok",
        "p95 ms/tok",
        "TTFT ms",
        "p95 TTFT",
        "TPOT ms",
        "ITL ms",
        "p95 ITL",
        "goodput r/s",
        "SLO %",
        "preempt",
        "swaps",
    )
    for col in cols:
        table.add_column(col, justify="left" if not col else "right")
    for label, m in rows.items():
        att = m.get("slo_attainment", math.nan)
        table.add_row(
            label,
            f"{m['finished']}/{m['jobs']}",
            _ms(m["avg"]),
            _ms(m["p95"]),
            _ms(m["ttft"]),
            _ms(m["ttft_p95"]),
            _ms(m["tpot"]),
            _ms(m["itl"]),
            _ms(m["itl_p95"]),
            "-" if math.isnan(m["goodput"]) else f"{m['goodput']:.2f}",
            "-" if math.isnan(att) else f"{100 * att:.1f}",
            str(m["preemptions"]),
            str(m["swaps"]),
        )
    return table


def split_line(m: dict[str, Any]) -> str:
    """'latency split: queuing 71% execution 28% swapping 1%' (or why there is none)."""
    if f"{SPLIT[0]}_frac" not in m:
        return "latency split: not available (no telemetry from the daemon)"
    parts = "  ".join(f"{p} {100 * m[f'{p}_frac']:.0f}%" for p in SPLIT)
    return f"latency split: {parts}"


def run_play_command(
    scenario_path: Path,
    endpoint: str,
    telemetry_endpoint: str,
    opts: PlayOptions,
    records_path: Path | None,
    json_path: Path | None,
    timeout: float,
    curve: CurveKeys | None,
    token: str | None = None,
) -> PlayResult:
    """`fsctl play`: load, play, write the records (and JSON), print the summary.

    `token`: the operator token (the scenario's retune and inject events need it)."""
    from fsd.workload.scenario import load_scenario

    scenario = load_scenario(scenario_path)
    timeline = prepare(scenario, opts)
    err = Console(stderr=True)
    err.print(
        f"[bold]{scenario.name}[/]: {len(timeline.arrivals)} jobs, {len(timeline.actions)} "
        f"actions over {timeline.duration:.1f} s ({timeline.rate:.2f} jobs/s) -> {endpoint}",
        highlight=False,
    )
    result = play(
        timeline,
        endpoint,
        telemetry_endpoint,
        opts,
        timeout=timeout,
        curve=curve,
        console=err,
        token=token,
    )
    path = records_path or Path(f"play-{scenario.name}.jsonl")
    write_records(path, result)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "scenario": scenario.name,
            "source": scenario.source,
            "options": opts.__dict__,
            "wall_s": result.wall_s,
            "summary": result.summary,
            "actions": result.actions,
            "kv_series": result.telemetry.kv_series(result.started),
        }
        json_path.write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    out = Console() if Console().is_terminal else Console(width=200)
    slo = result.summary.get("slo")
    title = f"{scenario.name}: per-job latency" + (f", SLO {slo * 1e3:.1f} ms/token" if slo else "")
    out.print(summary_table({scenario.name: result.summary}, title))
    out.print(split_line(result.summary), highlight=False)
    for a in result.actions:
        state = "ok" if a.get("ok") else f"refused: {a.get('error')}"
        out.print(f"{a['kind']} at {a['at']:.1f} s {a['changes'] or ''} {state}", highlight=False)
    err.print(f"records: {path}", highlight=False)
    return result

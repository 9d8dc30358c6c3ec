"""How right is the what-if preview? (issue P14) Predicted vs observed, on the real engine.

    .venv/bin/python bench/whatif.py                         # every case (~16 min, 2 cores)
    .venv/bin/python bench/whatif.py --rate 8 --warmup 40    # overloaded
    .venv/bin/python bench/whatif.py --only fcfs,batch-half --horizon 30

For each case a fresh daemon (`fsd start`, the embedded tiny model on this CPU) plays
one scenario: gamma arrivals (rate --rate, CV --cv) of lognormal prompts and outputs,
injected so that the daemon itself times the arrivals. After --warmup seconds the
bench sends, on one connection and in this order, a `Preview` of the case's change
and the `Retune` that applies it: the preview's snapshot and the retune are one
message apart. The preview predicts the next --horizon seconds; the bench then waits
for every job and measures the same window (fsd.twin.figures: jobs finished in the
window, per-token latency = end-to-end / output tokens) from the jobs' own timings.

Cases: control (policy=default on the default: nothing changes), fcfs (default ->
fcfs), quanta-x4 (sj-mlfq with explicit quanta, all x4), batch-half (max_batch_size
halved), recompute (kv_policy proactive -> recompute).

Goal: the observed average per-token latency within the predicted spread (lowest
to highest seed) or within 25% of the predicted mean, in at least 3 of the 4 retunes.

Prints a table and writes JSON (default bench/results/whatif-cpu-rate<R>.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import zmq
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon import BenchDaemon, DaemonSpec  # noqa: E402
from machine import describe_machine  # noqa: E402

from fsd import protocol as P  # noqa: E402
from fsd.client import Client  # noqa: E402
from fsd.credentials import find_operator_token  # noqa: E402
from fsd.twin.figures import JobTimes, window_figures  # noqa: E402

TOLERANCE = 0.25
QUANTA = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)


@dataclass(frozen=True)
class Case:
    policy: str  # the daemon starts with this policy
    changes: dict[str, Any]
    quanta: tuple[float, ...] | None = None
    control: bool = False  # not a retune: the twin's baseline against itself


def cases(batch: int) -> dict[str, Case]:
    return {
        "control": Case("default", {"policy": "default"}, control=True),
        "fcfs": Case("default", {"policy": "fcfs"}),
        "quanta-x4": Case("sj-mlfq", {"quanta": [4 * q for q in QUANTA]}, QUANTA),
        "batch-half": Case("default", {"max_batch_size": batch // 2}),
        "recompute": Case("default", {"kv_policy": "recompute"}),
    }


@dataclass
class Outcome:
    name: str
    changes: dict[str, Any]
    predicted: dict[str, dict[str, float]]  # figure -> mean/lo/hi (the proposed side)
    current: dict[str, dict[str, float]]
    observed: dict[str, float]
    assumptions: dict[str, Any]
    preview_wall_s: float
    preview_share: float  # engine-thread time on previews / on steps
    control: bool = False
    within: bool = field(init=False)
    error: float = field(init=False)

    def __post_init__(self) -> None:
        p, obs = self.predicted["avg"], self.observed["avg"]
        self.error = (obs - p["mean"]) / p["mean"] if p["mean"] else float("nan")
        self.within = p["lo"] <= obs <= p["hi"] or abs(self.error) <= TOLERANCE


def daemon_config(case: Case, args: argparse.Namespace) -> str:
    quanta = f"quanta = {list(case.quanta)}\n" if case.quanta else ""
    return (
        f"[cache]\nnum_gpu_blocks = {args.gpu_blocks}\nnum_host_blocks = {4 * args.gpu_blocks}\n"
        f'kv_policy = "proactive"\n[sched]\npolicy = "{case.policy}"\n'
        f"max_batch_size = {args.batch}\n{quanta}"
        "[server]\ntelemetry_hz = 2\nclient_timeout = 900.0\n"
    )


def scenario(args: argparse.Namespace) -> str:
    return (
        '[scenario]\nname = "whatif"\n'
        f"seed = {args.seed}\nduration = {args.warmup + args.horizon}\n\n"
        f'[[phase]]\nname = "load"\narrival = "gamma"\nrate = {args.rate}\ncv = {args.cv}\n'
        'lengths = { prompt = { dist = "lognormal", mean = 160, sigma = 0.7 }, '
        'output = { dist = "lognormal", mean = 48, sigma = 0.9 }, max_context = 1000 }\n'
    )


def _spreads(side: P.PreviewSide) -> dict[str, dict[str, float]]:
    return {k: {"mean": s.mean, "lo": s.lo, "hi": s.hi} for k, s in _fields(side).items()}


def _fields(side: P.PreviewSide) -> dict[str, P.Spread]:
    return {k: getattr(side, k) for k in side.__struct_fields__}


def preview_then_retune(d: BenchDaemon, token: str, case: Case, args: argparse.Namespace):
    """The preview and the retune, one message apart; the preview's reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    try:
        msg = P.Preview(token=token, changes=case.changes, horizon=args.horizon,
                        seeds=args.seeds, req_id="whatif")  # fmt: skip
        sock.send(P.encode(msg))
        sock.send(P.encode(P.Retune(token=token, changes=case.changes)))
        reply, acked = None, False
        deadline = time.time() + 900
        while (reply is None or not acked) and time.time() < deadline:
            if not sock.poll(500):
                continue
            rep = P.decode_reply(sock.recv())
            if isinstance(rep, P.Error):
                raise SystemExit(f"{case.changes}: refused: {rep.code}: {rep.message}")
            if isinstance(rep, P.PreviewReply):
                reply = rep
            elif isinstance(rep, P.Ack) and rep.what == "retune":
                acked = True
        if reply is None:
            raise SystemExit(f"{case.changes}: no preview within 900 s")
        return reply
    finally:
        sock.close()


def run_case(name: str, case: Case, args: argparse.Namespace) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fsd.toml"
        config.write_text(daemon_config(case, args))
        with BenchDaemon(DaemonSpec(policy=case.policy, config=str(config), telemetry_hz=2)) as d:
            token = find_operator_token(d.endpoint, d.state_dir)
            assert token is not None
            with Client(d.endpoint, timeout=60.0, token=token) as c:
                ids = c.inject(scenario=scenario(args), tag="whatif")
                time.sleep(args.warmup)
                reply = preview_then_retune(d, token, case, args)
                ends = c.wait_injected(ids)
                status = c.status()
    t0 = reply.assumptions.taken_at
    times = [
        JobTimes(f.timings.arrival, f.timings.first_token, f.timings.finish, len(f.token_ids))
        for f in ends.values()
    ]
    observed = window_figures(times, t0, t0 + args.horizon, reply.assumptions.slo)
    # what the twin could not know: the arrival rate the window really had
    came = sum(t0 < j.arrival <= t0 + args.horizon for j in times)
    observed["arrival_rate"] = came / args.horizon
    a = reply.assumptions
    return Outcome(
        name=name,
        changes=case.changes,
        predicted=_spreads(reply.proposed),
        current=_spreads(reply.current),
        observed=observed,
        assumptions={k: getattr(a, k) for k in a.__struct_fields__},
        preview_wall_s=reply.wall_s,
        preview_share=status.preview_seconds / max(status.step_seconds, 1e-9),
        control=case.control,
    )


def _show(x: float, scale: float = 1e3) -> str:
    return "-" if x != x else f"{x * scale:.1f}"


def table(rows: list[Outcome]) -> Table:
    t = Table(title="What-if: predicted vs observed over the horizon (per-token latency, ms)")
    for col in ("case", "change", "predicted current", "predicted proposed [lo-hi]",
                "observed", "error", "ok", "P99 TTFT pred/obs s", "finished pred/obs",
                "rate fit/real"):  # fmt: skip
        t.add_column(col)
    for r in rows:
        p, c, o = r.predicted, r.current, r.observed
        t.add_row(
            r.name,
            " ".join(f"{k}={v}" for k, v in r.changes.items())[:40],
            _show(c["avg"]["mean"]),
            f"{_show(p['avg']['mean'])} [{_show(p['avg']['lo'])}-{_show(p['avg']['hi'])}]",
            _show(o["avg"]),
            f"{r.error:+.0%}",
            "yes" if r.within else "NO",
            f"{_show(p['ttft_p99']['mean'], 1)}/{_show(o['ttft_p99'], 1)}",
            f"{p['finished']['mean']:.0f}/{o['finished']:.0f}",
            f"{r.assumptions['arrival_rate']:.2f}/{o['arrival_rate']:.2f}",
        )
    return t


def snapshot_cost(sizes: list[int]) -> list[dict[str, float]]:
    """Engine-thread time of one snapshot with N live jobs (the tiny engine, in process)."""
    from fsd import LLM, SamplingParams
    from fsd.twin.snapshot import take_snapshot

    eng = LLM("tiny", num_gpu_blocks=4096, num_host_blocks=8192, max_batch_size=32).engine
    rows = []
    for n in sizes:
        while len(eng.scheduler) < n:
            i = len(eng.scheduler)
            prompt = [1 + (i * 7 + k) % 200 for k in range(64 + i % 200)]
            eng.add_request(prompt, SamplingParams(max_tokens=10_000, ignore_eos=True))
        for _ in range(3):
            eng.step()
        cfg = eng.config
        take_snapshot(eng.scheduler, eng.history, cfg.sched, cfg.cache, 1.0)  # warm
        t0 = time.perf_counter()
        for _ in range(10):
            snap = take_snapshot(eng.scheduler, eng.history, cfg.sched, cfg.cache, 1.0)
        ms = (time.perf_counter() - t0) / 10 * 1e3
        rows.append({"live_jobs": n, "snapshot_ms": ms, "bytes": len(snap.scheduler)})
    eng.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--rate", type=float, default=5.0, help="arrivals per second")
    ap.add_argument("--cv", type=float, default=2.0, help="inter-arrival CV")
    ap.add_argument("--batch", type=int, default=16, help="max_batch_size at start")
    ap.add_argument("--gpu-blocks", type=int, default=192, help="KV blocks of 16 tokens")
    ap.add_argument("--warmup", type=float, default=90.0, help="seconds before the preview")
    ap.add_argument("--horizon", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7, help="the scenario's seed")
    ap.add_argument("--snapshot-sizes", default="100,300,600", help="live jobs ('' skips)")
    ap.add_argument("--out", default="", help="default bench/results/whatif-cpu-rate<R>.json")
    args = ap.parse_args()
    args.out = args.out or f"bench/results/whatif-cpu-rate{args.rate:g}.json"
    chosen = cases(args.batch)
    names = [n for n in args.only.split(",") if n] or list(chosen)
    unknown = [n for n in names if n not in chosen and n != "none"]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; cases: {', '.join(chosen)}, none")
    names = [n for n in names if n != "none"]
    rows = []
    console = Console(width=160)
    sizes = [int(n) for n in args.snapshot_sizes.split(",") if n]
    snaps = snapshot_cost(sizes) if sizes else []
    for r in snaps:
        console.print(f"snapshot of {r['live_jobs']} live jobs: {r['snapshot_ms']:.1f} ms "
                      f"on the engine thread, {r['bytes'] / 1e3:.0f} kB")  # fmt: skip
    for name in names:
        console.print(f"[bold]{name}[/]: {chosen[name].changes}")
        rows.append(run_case(name, chosen[name], args))
        console.print(table(rows[-1:]))
    console.print(table(rows))
    retunes = [r for r in rows if not r.control]
    hits = sum(r.within for r in retunes)
    console.print(f"within the spread or {TOLERANCE:.0%}: {hits} of {len(retunes)} retunes")
    out = {
        "machine": describe_machine(torch.device("cpu")),
        "args": vars(args),
        "goal": "observed avg per-token latency within the predicted spread or 25%, >= 3 of 4",
        "within": hits,
        "retunes": len(retunes),
        "cases": [r.__dict__ for r in rows],
        "snapshot_cost": snaps,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""What `fsd simulate` does with its options: configs, runs or sweeps, and the report.

The command (fsd/sim/cli.py) hands every option over by name; the config slices are
built from the options named after their fields. Heavy imports happen in `simulate`
so that `fsd --help` does not pay for them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsd.config import CacheConfig, ClusterConfig, SchedConfig
from fsd.errors import ConfigError
from fsd.sim import cli_report as out
from fsd.sim.cli_workload import load_scenario_workload, load_workload

if TYPE_CHECKING:
    from fsd.cost import CostModel
    from fsd.sim.runner import RunSpec


def simulate(options: Mapping[str, Any]) -> dict[str, Any]:
    """Run (or sweep) every policy of `--policies` on the workload; print and return the report.

    `options`: every option of the command by name (its own and the config fields')."""
    from fsd.sched.chunking import prefill_budget
    from fsd.sched.slo import default_slo
    from fsd.sim.capacity import max_context_of

    o = Options(options)
    names = policy_names(o.policies)
    cost = cost_model(o.profile, o.pp)
    ctx = max_context_of(cost) if o.max_context is None else (o.max_context or None)
    workload, actions = _workload(o, ctx)
    sched, cache = configs(o, workload)
    cluster = cluster_config(o)
    slo = o.slo if o.slo is not None else default_slo(cost)
    specs = [replace(s, cluster=cluster) for s in _specs(o, names, sched, cache, slo)]
    pools = specs[0].simulator(cost).pools
    summary = workload.summary()
    layout = cost.name + (
        f" ({cost.pipeline_stages} pipeline stages)" if cost.pipeline_stages > 1 else ""
    )
    budget = prefill_budget(sched.prefill_chunk, cost, cache.block_size)
    out.print_header(summary, layout, slo, pools, ctx, sched, o.kv_policy, budget, cluster)
    out.print_actions(actions)
    report: dict[str, Any] = {
        "workload": {**summary, **{k: v for k, v in workload.params.items() if k != "window"}},
        "unsimulated_actions": [
            {"time": x.time, "kind": x.kind, "changes": x.changes} for x in actions
        ],
        "profile": cost.name,
        "pipeline_stages": cost.pipeline_stages,
        "slo": slo,
        "max_context": ctx,
        "pools": asdict(pools),
        "sched": asdict(sched),
        "cache": asdict(cache),
        "cluster": asdict(cluster),
    }
    if o.sweep:
        _sweep(o, specs, cost, workload, slo, report)
    else:
        _run(o, specs, cost, workload, slo, report)
    return report


def policy_names(policies: str) -> list[str]:
    """The --policies list, each checked against the registry, duplicates dropped."""
    from fsd.sched.registry import resolve_policy

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies names no policy")
    for name in names:
        resolve_policy(name)
    return list(dict.fromkeys(names))


def cost_model(profile: str, pp: int | None) -> CostModel:
    """The profile's cost model, with --pp micro-batches in flight when given."""
    from fsd.cost.profiles import load_profile

    cost = load_profile(profile)
    if pp is not None:
        if pp < 1:
            raise ConfigError(f"--pp must be >= 1, got {pp}")
        # the profile's times stay the latency through the model; pp sets the overlap
        cost = replace(cost, pipeline_stages=pp)
    return cost


def _workload(o: Options, ctx: int | None) -> tuple[Any, tuple]:
    """The workload and, for a scenario, its timed actions (reported, not simulated)."""
    if o.scenario is not None:
        given = {"--trace": o.trace, "--arrival": o.arrival, "--rate": o.rate}
        given |= {"--cv": o.cv, "--lengths": o.lengths, "--theta": o.theta}
        return load_scenario_workload(
            o.scenario, o.time_scale, o.length_scale, o.limit, given, ctx, not o.no_clip
        )
    if o.length_scale != 1.0:
        raise ConfigError("--length-scale applies to a scenario")
    synthetic = (o.arrival, o.rate, o.cv, o.lengths, o.theta, o.seed)
    workload = load_workload(o.trace, o.time_scale, o.limit, *synthetic, ctx, not o.no_clip)
    return workload, ()


def configs(o: Options, workload: Any) -> tuple[SchedConfig, CacheConfig]:
    """The scheduler and cache slices every run shares (the policy is set per run): the
    options named after their fields (the pools' sizes go to each run, not the slice)."""
    from fsd.kv.registry import check_kv_policy

    _, prompts, outputs = workload.arrays()
    longest = int((prompts + outputs - 1).max())
    batch_tokens = o.max_batch_tokens or max(SchedConfig().max_batch_tokens, longest)
    sched = SchedConfig(**{**given(o, SchedConfig), "max_batch_tokens": batch_tokens})
    cache = CacheConfig(**given(o, CacheConfig, skip=("num_gpu_blocks", "num_host_blocks")))
    check_kv_policy(cache.kv_policy)
    return sched, cache


def cluster_config(o: Options) -> ClusterConfig:
    """The replicas and router every run shares (the router's name checked here)."""
    from fsd.router.registry import check_router

    cluster = ClusterConfig(**given(o, ClusterConfig))
    check_router(cluster.router)
    return cluster


class Options(dict):
    """The command's options by name, read as attributes (`o.trace`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def given(o: Mapping[str, Any], config: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options named after a field of `config` (less `skip`)."""
    names = {f.name for f in fields(config)} - set(skip)
    return {k: v for k, v in o.items() if k in names}


def _specs(
    o: Options, names: list[str], sched: SchedConfig, cache: CacheConfig, slo: float
) -> list[RunSpec]:
    """One run per policy; with --jobs-csv each writes its job records there."""
    from fsd.sim.runner import RunSpec

    base = RunSpec("base", sched, cache, o.num_gpu_blocks, o.num_host_blocks, slo, o.kv_sample)
    specs = [base.with_policy(name) for name in names]
    if o.jobs_csv is not None:
        if o.sweep:
            raise ConfigError("--jobs-csv records one run per policy; --sweep makes many")
        folder = records_dir(o.jobs_csv)
        specs = [replace(s, jobs_csv=folder / f"{s.label}.csv") for s in specs]
    return specs


def _sweep(
    o: Options, specs: list[RunSpec], cost: Any, workload: Any, slo: float, report: dict
) -> None:
    """Each policy's max rate (and P95 goodput) into the report, then the tables."""
    from fsd.progress import Progress
    from fsd.sim.metrics import SUSTAINED_FRACTION
    from fsd.sim.sweep import GOODPUT_QUANTILE, sweep_all

    targets = ("slo", "goodput95") if o.sweep_goodput else ("slo",)
    with Progress(f"sweeping {len(specs)} policies ({' and '.join(targets)} bisections)"):
        found = sweep_all(specs, cost, workload, o.sweep_metric, 1.0, o.sweep_tol, o.jobs, targets)
    trace_scale = o.time_scale if o.trace is not None else None
    report["sweep"] = {
        "metric": o.sweep_metric,
        "tol": o.sweep_tol,
        "base_rate": workload.rate,
        "sustained_fraction": SUSTAINED_FRACTION,
    }
    refs = [r["goodput95"].reference for r in found.values() if "goodput95" in r]
    if refs and refs[0] is not None:  # every spec here differs in policy alone: one reference
        light = refs[0].to_dict()
        if trace_scale is not None:
            light["time_scale"] = refs[0].scale * trace_scale
        report["sweep"]["goodput95"] = {"quantile": GOODPUT_QUANTILE, "light_load": light}
    report["policies"] = {k: sweep_row(r, trace_scale) for k, r in found.items()}
    out.print_sweep(report["policies"], trace_scale, slo, o.sweep_metric)
    out.print_probes(report["policies"], trace_scale, o.sweep_metric)
    if "goodput95" in report["sweep"]:
        out.print_light_load(report["sweep"]["goodput95"]["light_load"])


def sweep_row(by_target: dict[str, Any], trace_scale: float | None) -> dict[str, Any]:
    """One policy's JSON row: the max-rate result, with the goodput95 result nested."""
    row = by_target["slo"].to_dict()
    g = by_target.get("goodput95")
    if g is not None:
        row["goodput95"] = {
            "max_scale": g.max_scale,
            "max_rate": g.max_rate,
            "bracketed": g.bracketed,
            "points": g.points,
        }
    if trace_scale is not None:  # the trace's own time scale at the found multipliers
        row["max_time_scale"] = row["max_scale"] * trace_scale
        if g is not None:
            row["goodput95"]["max_time_scale"] = g.max_scale * trace_scale
    return row


def _run(
    o: Options, specs: list[RunSpec], cost: Any, workload: Any, slo: float, report: dict
) -> None:
    from fsd.progress import Progress
    from fsd.sim.runner import run_many, run_one

    if o.jobs <= 1:  # one run at a time: each shows its requests done
        rows = {}
        for spec in specs:
            with Progress(f"simulating {spec.label}", len(workload)) as bar:
                rows[spec.label] = run_one(spec, cost, workload, bar.update)
        report["policies"] = rows
    else:  # runs in other processes: only the time they take so far
        with Progress(f"simulating {len(specs)} policies on {o.jobs} processes"):
            report["policies"] = run_many(specs, cost, workload, o.jobs)
    out.print_table(report["policies"], slo)
    if o.jobs_csv is not None:
        out.console().print(f"per-job records: {o.jobs_csv}/<policy>.csv", highlight=False)


def records_dir(path: Path) -> Path:
    """The --jobs-csv directory, created now so that a bad path fails before any run."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--jobs-csv: cannot create {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"--jobs-csv: {path} is not writable")
    return path

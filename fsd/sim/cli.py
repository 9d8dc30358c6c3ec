"""`fsd simulate`: replay a trace or a synthetic workload through several policies.

The command function lives here (registered on the `fsd` app by `fsd/cli.py`); what
it runs is in `cli_run`, where its workload comes from in `cli_workload`, what it
prints in `cli_report`. Options that set a config field take the config's default
(`default_of`), and the help names the registries' entries, so neither is retyped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from fsd.cli_errors import fail, friendly
from fsd.cli_fields import field_names, field_options, with_fields
from fsd.cli_options import default_of, one_of
from fsd.config import CacheConfig, ClusterConfig, SchedConfig
from fsd.kv.registry import KV_POLICIES
from fsd.router.registry import ROUTERS
from fsd.sched.registry import POLICIES, policy_setting_notes
from fsd.sched.slo import SLO_DECODE_STEPS
from fsd.sim.cli_run import simulate
from fsd.sim.cli_workload import DEFAULT_RATE, DEFAULT_REQUESTS
from fsd.workload.arrivals import ARRIVALS
from fsd.workload.length_models import PRESETS as LENGTH_MODELS

DEFAULT_POLICIES = ",".join(POLICIES)
DEFAULT_PROFILE = "opt-13b-a100"


# the config fields `fsd simulate` sets, each an option generated from its field (a
# field added to SchedConfig is an option here with no line changed; a policy's own
# settings, its rules among them, go through --policy-settings POLICY.FIELD=VALUE)
SIM_SCHED = field_names(SchedConfig, skip=("policy", "quanta", "refuse_late", "profile"))
SIM_CACHE = field_names(
    CacheConfig, skip=("gpu_memory_utilization", "cpu_device_kv_bytes", "host_kv_bytes")
)
SIM_CLUSTER = field_names(ClusterConfig)  # replicas behind a router (fsd.sim.replicas)
_SIM_HELPS = {
    "max_batch_tokens": "Most new tokens per iteration (default: "
    f"max({default_of(SchedConfig, 'max_batch_tokens')}, longest request)).",
    "kv_policy": f"{one_of(KV_POLICIES)}.",
    "router": f"With --replicas > 1: {one_of([*ROUTERS, 'default'])}.",
}


# the options of `fsd simulate`, each a type its signature names
Scenario = Annotated[
    Path | None,
    typer.Argument(help="A scenario TOML file (man fsd-scenario) to simulate."),
]
LengthScale = Annotated[
    float, typer.Option(help="Scenario only: multiply every job's token counts.")
]
Trace = Annotated[
    Path | None,
    typer.Option(
        help="Trace: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake .jsonl."
    ),
]
TimeScale = Annotated[
    float, typer.Option(help="Trace rate multiplier: 0.5 = half the rate (gaps x2).")
]
Limit = Annotated[
    int | None,
    typer.Option(
        help="A trace's or scenario's first N requests (default: all of them), or N "
        f"synthetic requests (default {DEFAULT_REQUESTS})."
    ),
]
Arrival = Annotated[str | None, typer.Option(help=f"Synthetic arrivals: {one_of(ARRIVALS)}.")]
Rate = Annotated[
    float | None,
    typer.Option(help=f"Synthetic arrival rate, requests/s (default {DEFAULT_RATE:g})."),
]
Cv = Annotated[float | None, typer.Option(help="Inter-arrival coefficient of variation (gamma).")]
Lengths = Annotated[
    str | None,
    typer.Option(help=f"{one_of([*LENGTH_MODELS, 'mix:A+B:W (W from A)'])}."),
]
Theta = Annotated[float | None, typer.Option(help="Zipf skew for --lengths zipf.")]
Seed = Annotated[int, typer.Option(help="Seed of the synthetic workload.")]
MaxContext = Annotated[
    int | None,
    typer.Option(
        help="Clip requests to this many tokens (default: the profile's context; 0 = no clip)."
    ),
]
NoClip = Annotated[
    bool,
    typer.Option(
        "--no-clip", help="Refuse a workload with requests past the context; do not clip."
    ),
]
Policies = Annotated[
    str,
    typer.Option(help=f"Comma-separated policies ({', '.join((*POLICIES, 'default'))})."),
]
Profile = Annotated[str, typer.Option(help="Shipped profile name or profile JSON path.")]
Pp = Annotated[
    int | None,
    typer.Option(
        help="Pipeline stages: micro-batches in flight (default: the profile's; 1 = none)."
    ),
]
Slo = Annotated[
    float | None,
    typer.Option(help=f"Per-token latency SLO, s (default {SLO_DECODE_STEPS} x a decode step)."),
]
Sweep = Annotated[
    bool,
    typer.Option(
        help="Find each policy's max sustainable rate under the SLO and its P95 goodput "
        "(bisection)."
    ),
]
SweepMetric = Annotated[
    str, typer.Option(help="Latency statistic the SLO bounds: avg, p50, p95 or p99.")
]
SweepTol = Annotated[float, typer.Option(help="Stop when hi / lo <= 1 + tol.")]
SweepGoodput = Annotated[
    bool,
    typer.Option(
        help="With --sweep: also the P95 goodput (95% of jobs within 10 x the "
        "light-load TTFT and TPOT)."
    ),
]
KvSample = Annotated[
    float | None, typer.Option(help="Record KV usage every S seconds into the JSON.")
]
Jobs = Annotated[int, typer.Option(help="Worker processes (runs are independent).")]
JobsCsv = Annotated[
    Path | None,
    typer.Option(help="Write every job's record to DIR/<policy>.csv (not with --sweep)."),
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")]


@with_fields(
    field_options(
        SchedConfig,
        SIM_SCHED,
        defaults={"max_batch_tokens": None},
        helps=_SIM_HELPS,
        notes=policy_setting_notes(),
    ),
    field_options(CacheConfig, SIM_CACHE, helps=_SIM_HELPS),
    field_options(ClusterConfig, SIM_CLUSTER, helps=_SIM_HELPS),
    before="slo",
)
def simulate_command(
    scenario: Scenario = None,
    length_scale: LengthScale = 1.0,
    trace: Trace = None,
    time_scale: TimeScale = 1.0,
    limit: Limit = None,
    arrival: Arrival = None,
    rate: Rate = None,
    cv: Cv = None,
    lengths: Lengths = None,
    theta: Theta = None,
    seed: Seed = 0,
    max_context: MaxContext = None,
    no_clip: NoClip = False,
    policies: Policies = DEFAULT_POLICIES,
    profile: Profile = DEFAULT_PROFILE,
    pp: Pp = None,
    slo: Slo = None,
    sweep: Sweep = False,
    sweep_metric: SweepMetric = "avg",
    sweep_tol: SweepTol = 0.05,
    sweep_goodput: SweepGoodput = True,
    kv_sample: KvSample = None,
    jobs: Jobs = 1,
    jobs_csv: JobsCsv = None,
    json_out: JsonOut = None,
    **fields: Any,
) -> None:
    """Simulate serving a workload under several scheduling policies; print and save metrics."""
    options = {**locals(), **fields}  # every option, by name (first: nothing else yet)
    del options["fields"]
    with friendly():
        report = simulate(options)
    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=2, default=float) + "\n")
        except OSError as exc:
            fail(f"cannot write {json_out}: {exc.strerror}")

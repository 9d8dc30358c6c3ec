"""`fsd`: the command line of the serving daemon."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console

from fsd.cli_common import add_common_commands
from fsd.cli_errors import fail, friendly
from fsd.cli_fields import field_options, with_fields
from fsd.cli_options import (
    CLI_MAX_TOKENS,
    CONFIG_FIELDS,
    ClientKey,
    ServerKey,
    curve_keys,
    default_of,
    given_argv,
    one_of,
    version_option,
)
from fsd.config import (
    DEVICES,
    DTYPES,
    CacheConfig,
    ClusterConfig,
    ModelConfig,
    ParallelConfig,
    SchedConfig,
    ServerConfig,
)
from fsd.errors import ConfigError
from fsd.jobs import SamplingParams
from fsd.kv.registry import KV_POLICIES
from fsd.router.registry import ROUTERS
from fsd.sched.registry import POLICIES, engine_policy, policy_setting_notes
from fsd.sim.cli import simulate_command

if TYPE_CHECKING:
    from fsd.engine.output import RequestOutput

app = typer.Typer(help="fsd: a FastServe-style LLM serving daemon.", no_args_is_help=True)
err = Console(stderr=True)


@app.callback()
def main(version: Annotated[Optional[bool], version_option("fsd")] = None) -> None:  # noqa: UP045
    """fsd: a FastServe-style LLM serving daemon."""


def _runs_in_engine(name: str) -> bool:
    try:
        engine_policy(name)
    except ConfigError:
        return False
    return True


# what the daemon serves with: the registry's policies, less the simulator's oracle
ENGINE_POLICIES = ("default", *(p for p in POLICIES if _runs_in_engine(p)))
# the options of `fsd start` that are not config fields (every other one is, by name)
START_OWN_OPTIONS = ("foreground", "config", "log_level", "wait")

_MODEL_HELP = "Preset name or local HuggingFace directory."
_DEVICE_HELP = f"{one_of(DEVICES)}."
_DTYPE_HELP = f"{one_of(DTYPES)}."
# the daemon `fsd stop` and `fsd status` address, and where its files are
DaemonEndpoint = Annotated[str, typer.Option(help="The daemon's endpoint.")]
StateDir = Annotated[Optional[str], typer.Option(help="Where its pidfile and operator token are.")]  # noqa: UP045


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="Prompt text.")],
    model: Annotated[str, typer.Option(help=_MODEL_HELP)] = default_of(ModelConfig, "model"),
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = CLI_MAX_TOKENS,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = default_of(SamplingParams, "temperature"),
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = all).")] = default_of(SamplingParams, "top_k"),
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = default_of(SamplingParams, "top_p"),
    seed: Annotated[Optional[int], typer.Option(help="Seed of this request's draws.")] = default_of(SamplingParams, "seed"),  # noqa: UP045
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,  # noqa: UP045
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = default_of(SamplingParams, "ignore_eos"),
    device: Annotated[str, typer.Option(help=_DEVICE_HELP)] = default_of(ModelConfig, "device"),
    dtype: Annotated[str, typer.Option(help=_DTYPE_HELP)] = default_of(ModelConfig, "dtype"),
    num_gpu_blocks: Annotated[Optional[int], typer.Option(help="KV blocks on the device.")] = default_of(CacheConfig, "num_gpu_blocks"),  # noqa: UP045
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = default_of(CacheConfig, "block_size"),
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree (Ray workers).")] = default_of(ParallelConfig, "tp"),
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree (Ray workers).")] = default_of(ParallelConfig, "pp"),
    ray_address: Annotated[Optional[str], typer.Option(help="Join this Ray cluster (default: start one when tp*pp > 1).")] = default_of(ParallelConfig, "ray_address"),  # noqa: UP045
    stats: Annotated[bool, typer.Option(help="Print timings to stderr at the end.")] = False,
) -> None:
    """Generate from PROMPT in this process, streaming tokens to stdout."""
    from fsd.llm import LLM

    llm = final = None
    with friendly():
        try:
            llm = LLM(
                model=model,
                device=device,
                dtype=dtype,
                num_gpu_blocks=num_gpu_blocks,
                block_size=block_size,
                tp=tp,
                pp=pp,
                ray_address=ray_address,
            )
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                stop=tuple(stop or ()),
                ignore_eos=ignore_eos,
            )
            for delta in llm.stream(prompt, params):
                sys.stdout.write(delta.new_text)
                sys.stdout.flush()
                final = delta.output
            sys.stdout.write("\n")
        finally:
            if llm is not None:
                llm.close()
    if final is not None:
        _finish_generation(final, stats)


def _finish_generation(final: RequestOutput, stats: bool) -> None:
    """Print the timings to stderr when asked; exit with the error of a failed job."""
    if stats and final.ttft is not None and final.latency is not None:
        n = len(final.token_ids)
        err.print(
            f"{n} tokens, finish={final.finish_reason}, ttft={final.ttft * 1e3:.1f} ms, "
            f"total={final.latency * 1e3:.1f} ms, {n / max(final.latency, 1e-9):.1f} tok/s"
        )
    if final.finish_reason == "error":
        fail(f"the job failed: {final.error}")


# `fsd start`'s config fields by slice, each an option generated from its field; None
# keeps the file's value (or the config's default)
START_FIELDS = (
    (ModelConfig, ("model",)),
    (ServerConfig, ("endpoint", "telemetry_endpoint")),
    (SchedConfig, ("policy", "policy_settings")),
    (CacheConfig, ("kv_policy", "num_gpu_blocks", "num_host_blocks")),
    (SchedConfig, ("max_batch_size", "prefill_chunk")),
    (CacheConfig, ("prefix_cache",)),
    (ModelConfig, ("cuda_graphs", "schedule_ahead", "device", "dtype", "threads")),
    (ServerConfig, ("telemetry_hz", "stats_interval")),
    (SchedConfig, ("profile",)),
    (ServerConfig, ("state_dir", "http")),
    (ParallelConfig, ("tp", "pp", "ray_address")),
    (ClusterConfig, ("replicas", "router")),
)
_SETTINGS_NOTE = {"policy_settings": policy_setting_notes()["policy_settings"]}
_POLICY_HELPS = {
    "policy": f"{one_of(ENGINE_POLICIES)}.",
    "kv_policy": f"{one_of(KV_POLICIES)}.",
    "router": f"{one_of(['default', *ROUTERS])} (with --replicas > 1).",
}


@app.command()
@with_fields(
    *(
        field_options(cls, names, unset=True, helps=_POLICY_HELPS, notes=_SETTINGS_NOTE)
        for cls, names in START_FIELDS
    ),
    before="log_level",
)
def start(
    ctx: typer.Context,
    foreground: Annotated[bool, typer.Option(help="Serve in this process (systemd, containers).")] = False,
    config: Annotated[Optional[str], typer.Option(help="fsd.toml to read first.")] = None,  # noqa: UP045
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    wait: Annotated[float, typer.Option(help="Background: seconds to wait for the daemon to serve.")] = 300.0,
    **fields: Any,
) -> None:
    """Start the daemon (in the background unless --foreground).

    In the background, returns once the daemon serves (its pidfile says so), or
    prints the daemon's own error (a busy port, a bad key) and exits 2.
    """
    from fsd import daemon
    from fsd.config_file import build_configs

    options = {k: v for k, v in fields.items() if k in CONFIG_FIELDS}
    with friendly():
        engine_cfg, server_cfg, cluster_cfg = build_configs(config, **options)
        if foreground:
            daemon.setup_logging(log_level, server_cfg)
            daemon.serve_foreground(engine_cfg, server_cfg, cluster_cfg)
            return
        if wait <= 0:
            fail(f"--wait must be > 0 seconds, got {wait}")
        # the child is `fsd start --foreground` with the options given here, as given
        pid = daemon.start_background(given_argv(ctx, skip=("foreground", "wait")), server_cfg, wait)
    _, logfile = daemon.state_files(server_cfg)
    http = f", http://{server_cfg.http}/v1" if server_cfg.http else ""
    typer.echo(f"fsd started: pid {pid}, {server_cfg.endpoint}{http} (log {logfile})")


@app.command()
def stop(
    endpoint: DaemonEndpoint = default_of(ServerConfig, "endpoint"),
    timeout: Annotated[float, typer.Option(help="Seconds in-flight jobs get to finish.")] = 30.0,
    state_dir: StateDir = None,
    server_key: ServerKey = None,
    client_key: ClientKey = None,
) -> None:
    """Drain in-flight jobs (up to --timeout), then stop the daemon.

    Asks as the operator (the token in the state dir, or an operator CURVE key);
    a daemon of this state dir that does not answer gets SIGTERM, then SIGKILL.
    """
    from fsd import daemon
    from fsd.config_file import build_configs
    from fsd.credentials import find_operator_token

    with friendly():
        _, cfg, _ = build_configs(None, endpoint=endpoint, state_dir=state_dir)
        token = find_operator_token(cfg.endpoint, cfg.state_dir)
        pid = daemon.stop(cfg, timeout, curve=curve_keys(server_key, client_key), token=token)
    typer.echo(f"fsd stopped{f' (pid {pid})' if pid else ''}")


@app.command()
def status(
    endpoint: DaemonEndpoint = default_of(ServerConfig, "endpoint"),
    timeout: Annotated[float, typer.Option(help="Seconds to wait for an answer.")] = 5.0,
    state_dir: StateDir = None,
    server_key: ServerKey = None,
    client_key: ClientKey = None,
) -> None:
    """Print the daemon's pid, model, policy, load and this client's role."""
    from fsd import daemon
    from fsd.client import Client, DaemonUnavailable
    from fsd.config_file import build_configs
    from fsd.credentials import find_operator_token
    from fsd.local_daemon import check_daemon

    with friendly():
        _, cfg, _ = build_configs(None, endpoint=endpoint, state_dir=state_dir)
        token = find_operator_token(cfg.endpoint, cfg.state_dir)
        curve = curve_keys(server_key, client_key)
        check_daemon(cfg.endpoint, cfg.state_dir, timeout)  # at once when none can answer
        try:
            with Client(endpoint, timeout=timeout, curve=curve, token=token) as client:
                st = client.status()
        except DaemonUnavailable as exc:
            running = daemon.read_pidfile(cfg)
            if running is None:
                raise
            # our daemon is alive but silent: loading its model, or busy, or keys missing
            state = running.get("state", "starting")
            raise daemon.DaemonError(
                f"{exc}; pid {running.get('pid', '?')} holds its pidfile ({state}); "
                f"see {running.get('log') or daemon.state_files(cfg)[1]}"
            ) from None
    role = getattr(st, "role", None)
    typer.echo(
        f"pid {st.pid}  fsd {st.version}  model {st.model}  policy {st.policy}/{st.kv_policy}  "
        f"{f'replicas {st.replicas}  ' if st.replicas > 1 else ''}"
        f"jobs {st.jobs} (running {st.running})  iterations {st.iterations}  "
        f"up {st.uptime:.0f}s{'  DRAINING' if st.draining else ''}"
        f"{f'  DEGRADED: {st.degraded}' if st.degraded else ''}"
        f"{f'  role {role}' if role else ''}"
    )


keys_app = typer.Typer(help="CURVE keys for serving beyond loopback.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    directory: Annotated[str, typer.Argument(help="Where to write the key files (made 0700).")],
    clients: Annotated[int, typer.Option(help="How many client key pairs to make.")] = 1,
    operators: Annotated[int, typer.Option(help="How many operator key pairs to make.")] = 1,
) -> None:
    """Make a server key pair, client and operator key pairs; authorize them all.

    Secret keys are 0600 in 0700 folders. Operators' public keys also go to
    DIR/operators/ (curve_operators_dir): their requests have the operator role.
    """
    from fsd.server.security import generate_keys

    with friendly():
        made = generate_keys(directory, clients, operators)
    for name, path in made.items():
        typer.echo(f"{name:18s} {path}")
    typer.echo("\n# fsd.toml of the daemon:\n[server]")
    typer.echo(f'curve_secret_key = "{made["server_secret"]}"')
    typer.echo(f'curve_authorized_dir = "{made["authorized"]}"')
    typer.echo(f'curve_operators_dir = "{made["operators"]}"')
    client = made.get("operator-1_secret") or made.get("client-1_secret")
    if client is not None:
        typer.echo(
            f"\n# a client:\nfsctl --server-key {made['server_public']} --client-key {client} top"
        )


@app.command()
def presets() -> None:
    """List the built-in model presets (random weights, byte-level tokenizer)."""
    from fsd.models.presets import PRESETS

    for name, preset in PRESETS.items():
        arch = preset.arch
        typer.echo(
            f"{name:12s} {arch.model_type:7s} layers={arch.num_layers} hidden={arch.hidden_size} "
            f"heads={arch.num_heads}/{arch.num_kv_heads}"
        )


@app.command()
def profile(
    out: Annotated[
        str, typer.Option("--out", "-o", help="Where to write the profile JSON.")
    ] = "profile.json",
    model: Annotated[str, typer.Option(help=_MODEL_HELP)] = default_of(ModelConfig, "model"),
    quick: Annotated[
        bool, typer.Option(help="A few points only (the start-up calibration).")
    ] = False,
    device: Annotated[str, typer.Option(help=_DEVICE_HELP)] = default_of(ModelConfig, "device"),
    dtype: Annotated[str, typer.Option(help=_DTYPE_HELP)] = default_of(ModelConfig, "dtype"),
    num_gpu_blocks: Annotated[Optional[int], typer.Option(help="KV blocks on the device.")] = default_of(CacheConfig, "num_gpu_blocks"),  # noqa: UP045
) -> None:
    """Measure prefill, chunk and decode times on the running engine, fit the cost model, write JSON.

    Start the daemon or the offline API with `profile=PATH` to charge service by it.
    """
    from pathlib import Path

    from fsd.profile_command import run_profile_command

    options = {"device": device, "dtype": dtype}
    if num_gpu_blocks is not None:
        options["num_gpu_blocks"] = num_gpu_blocks
    with friendly():
        run_profile_command(model, Path(out), quick, options)


add_common_commands(app, "fsd")


app.command("simulate")(simulate_command)


if __name__ == "__main__":
    app()

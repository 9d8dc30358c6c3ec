"""The command lines' defaults are the config's: change a default in fsd/config.py (or a
registry's list) and every `fsd` / `fsctl` option that sets it follows, or this fails.

Each command is read through typer's own click command, so what is checked is what a
user gets, not what the source says.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec
import pytest
import typer

from fsd import config
from fsd import protocol as P
from fsd.cli import ENGINE_POLICIES, START_OWN_OPTIONS
from fsd.cli import app as fsd_app
from fsd.cli_options import CLI_MAX_TOKENS, CONFIG_FIELDS
from fsd.config import CacheConfig, ModelConfig, ParallelConfig, SchedConfig, ServerConfig
from fsd.console.cli import app as fsctl_app
from fsd.console.play import PlayOptions
from fsd.jobs import SamplingParams
from fsd.kv.registry import KV_POLICIES
from fsd.sched.registry import POLICIES, engine_policy, policy_setting_notes, setting_names
from fsd.sim.cli import SIM_CACHE, SIM_SCHED

# (app, command path, the dataclasses its options set, first match wins: `seed` of
# `generate` is the request's, not the model's; None = the app's global options)
COMMANDS = [
    (fsd_app, ("generate",), (SamplingParams, ModelConfig, CacheConfig, ParallelConfig)),
    (fsd_app, ("profile",), (ModelConfig, CacheConfig)),
    (fsd_app, ("simulate",), (SchedConfig, CacheConfig, config.ClusterConfig)),
    (fsd_app, ("stop",), (ServerConfig,)),
    (fsd_app, ("status",), (ServerConfig,)),
    (fsctl_app, (), (ServerConfig,)),
    (fsctl_app, ("submit",), (P.Sampling,)),  # fsctl sends the wire's sampling fields
    (fsctl_app, ("play",), (PlayOptions,)),
]

# options named after a field whose default is theirs to choose, and why
OWN_DEFAULTS = {
    ("generate", "max_tokens"): "a command line's answer is longer than the API's 16",
    ("submit", "max_tokens"): "as `fsd generate`",
    ("generate", "stop"): "a repeatable option: None is no stop string, as ()",
    ("submit", "stop"): "as `fsd generate`",
    ("simulate", "profile"): "the simulator needs a cost model: a shipped profile",
    ("simulate", "max_batch_tokens"): "None: the config's default or the longest request",
}
# the MLFQ policies' rules (fsd.sched.rules), and a few where fsd departs from the paper
RULES = ("alpha", "waiting_alpha", "promote", "charge_prefill", "demote", "threshold",
         "swap_gate", "express", "owner_leads")  # fmt: skip
DEPARTURES = [
    ("alpha", "100.0", "1.0"),
    ("promote", "up1", "top"),
    ("demote", "gittins", "always"),
    ("threshold", "3", "0"),
    ("swap_gate", "True", "False"),
]
# options that leave the value to the config (its file, then its default): None
CONFIG_DECIDES = {("stop", "state_dir"), ("status", "state_dir"), ("", "state_dir")}


def command(app: typer.Typer, path: tuple[str, ...]) -> Any:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def options(app: typer.Typer, path: tuple[str, ...]) -> dict[str, Any]:
    return {
        p.name: p for p in command(app, path).params if p.param_type_name == "option" and p.name
    }


def fields_of(cls: type) -> dict[str, Any]:
    """name -> default of a dataclass's or a msgspec Struct's fields."""
    if dataclasses.is_dataclass(cls):
        found = dataclasses.fields(cls)
        missing: Any = dataclasses.MISSING
    else:
        found = msgspec.structs.fields(cls)
        missing = msgspec.NODEFAULT
    return {
        f.name: f.default_factory() if f.default_factory is not missing else f.default
        for f in found
    }


def field_default(cls: type, name: str) -> Any:
    return fields_of(cls)[name]


def owner(classes: tuple[type, ...], name: str) -> type | None:
    return next((c for c in classes if name in fields_of(c)), None)


def backed_options(app, path, classes) -> list[tuple[str, Any, type]]:
    """(name, option, dataclass) of every option of the command named after a field."""
    found = []
    for name, opt in options(app, path).items():
        cls = owner(classes, name)
        if cls is not None:
            found.append((name, opt, cls))
    return found


@pytest.mark.parametrize(
    ("app", "path", "classes"), COMMANDS, ids=[" ".join(c[1]) or "fsctl" for c in COMMANDS]
)
def test_every_config_backed_option_defaults_to_the_field_default(app, path, classes):
    where = path[-1] if path else ""
    backed = backed_options(app, path, classes)
    assert backed, f"{path}: no option is named after a field of {classes}"
    wrong = []
    for name, opt, cls in backed:
        if (where, name) in OWN_DEFAULTS:
            continue
        if (where, name) in CONFIG_DECIDES and opt.default is None:
            continue
        if opt.default != field_default(cls, name):
            wrong.append(
                f"{opt.opts[0]}: {opt.default!r} != {cls.__name__}.{name} = {field_default(cls, name)!r}"
            )
    assert not wrong, f"{' '.join(path) or 'fsctl'}: " + "; ".join(wrong)


def test_the_checks_cover_the_options_that_matter():
    """A renamed option would silently drop out of the check above: pin the big ones."""
    covered = {
        (c[1][-1] if c[1] else "", name) for c in COMMANDS for name, _, _ in backed_options(*c)
    }
    for name in (
        "max_batch_size",
        "kv_policy",
        "block_size",
        "quantum_ratio",
        "num_levels",
        "policy_settings",
        "admit_fraction",
        "reserve_min_jobs",
        "reserve_top_levels",
    ):
        assert ("simulate", name) in covered, name
    for name in ("model", "device", "dtype", "block_size", "tp", "pp", "temperature", "top_p"):
        assert ("generate", name) in covered, name
    assert {("", "endpoint"), ("", "telemetry_endpoint"), ("stop", "endpoint")} <= covered
    assert {("play", "time_scale"), ("play", "drain_timeout"), ("submit", "top_k")} <= covered
    assert options(fsd_app, ("generate",))["max_tokens"].default == CLI_MAX_TOKENS


def test_start_leaves_every_config_field_to_the_config_and_names_no_other():
    """`fsd start` passes its options to build_configs by name: each is a config field
    (None keeps the file's value, then the dataclass default) or one of its own."""
    opts = options(fsd_app, ("start",))
    unknown = sorted(set(opts) - CONFIG_FIELDS - set(START_OWN_OPTIONS))
    assert not unknown, f"fsd start options that are no config field: {unknown}"
    assert set(START_OWN_OPTIONS) <= set(opts)
    fields = [n for n in opts if n in CONFIG_FIELDS]
    assert len(fields) >= 15
    assert all(opts[n].default is None for n in fields), [
        n for n in fields if opts[n].default is not None
    ]


def test_help_lists_the_registries():
    start = options(fsd_app, ("start",))
    engine = [p for p in POLICIES if p != "srpt"]
    assert list(ENGINE_POLICIES) == ["default", *engine]
    for name in ENGINE_POLICIES:
        assert name in start["policy"].help
    assert "srpt" not in start["policy"].help  # the daemon refuses it
    with pytest.raises(Exception, match="srpt"):
        engine_policy("srpt")
    for name in KV_POLICIES:
        assert name in start["kv_policy"].help
    for name in config.DEVICES:
        assert name in start["device"].help
    for name in config.DTYPES:
        assert name in start["dtype"].help
    sim = options(fsd_app, ("simulate",))
    assert sim["policies"].default == ",".join(POLICIES)
    for name in (*POLICIES, "default"):
        assert name in sim["policies"].help
    for name in KV_POLICIES:
        assert name in sim["kv_policy"].help
    assert str(SchedConfig().max_batch_tokens) in sim["max_batch_tokens"].help


def test_simulate_options_are_generated_from_the_config_fields():
    """`fsd simulate` sets SchedConfig and CacheConfig fields by name, each option generated
    from its field: a setting added to a slice is an option with no line of the command."""
    opts = options(fsd_app, ("simulate",))
    assert "policy_settings" in SIM_SCHED and "kv_policy" in SIM_CACHE
    for cls, names in ((SchedConfig, SIM_SCHED), (CacheConfig, SIM_CACHE)):
        for name in names:
            assert name in opts, name
            help_line = cls.__dataclass_fields__[name].metadata["help"]
            if name not in ("max_batch_tokens", "kv_policy"):  # their help names more
                assert opts[name].help.startswith(help_line), name
    for gone in ("starve_limit", "starve_promote", "demote_rule", "preempt_threshold"):
        assert gone not in opts, gone  # the policies' own rules: --policy-settings


@pytest.mark.parametrize("path", [("simulate",), ("start",)])
def test_the_policy_settings_help_names_each_rule_with_every_policys_value(path):
    """The MLFQ policies' rules are their own settings (`--policy-settings fsd.demote=always`,
    a toml's [sched.fsd] table): the option's help lists each, with its default."""
    help_text = options(fsd_app, path)["policy_settings"].help
    assert policy_setting_notes()["policy_settings"] in help_text
    for name in setting_names():
        assert f"{name} (default " in help_text, name
    for rule in RULES:
        assert f"fsd.{rule} (default " in help_text and f"sj-mlfq.{rule} (default " in help_text
    for rule, fsd, paper in DEPARTURES:
        assert f"fsd.{rule} (default {fsd})" in help_text, rule
        assert f"sj-mlfq.{rule} (default {paper})" in help_text, rule


def test_simulate_limit_help_says_what_runs_without_it(tmp_path):
    """--limit's help once said 2000 for a trace, which ran whole: it states each default."""
    from fsd.sim.cli_workload import DEFAULT_REQUESTS, load_workload

    limit = options(fsd_app, ("simulate",))["limit"]
    assert limit.default is None
    assert "(default: all of them)" in limit.help and f"(default {DEFAULT_REQUESTS})" in limit.help
    trace = tmp_path / "t.csv"
    rows = [f"{i * 0.5},{10 + i},{5 + i}" for i in range(DEFAULT_REQUESTS + 7)]
    trace.write_text("\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *rows]) + "\n")
    none = (None,) * 5  # arrival, rate, cv, lengths, theta
    assert len(load_workload(trace, 1.0, None, *none, 0, None)) == DEFAULT_REQUESTS + 7
    assert len(load_workload(trace, 1.0, 3, *none, 0, None)) == 3
    assert len(load_workload(None, 1.0, None, *none, 0, None)) == DEFAULT_REQUESTS


def test_the_example_config_names_only_real_policies_and_where_all_are_listed():
    """The example names the policies a reader picks from (none stale), and sends the
    reader to the generated help for the rest: a new policy edits no example."""
    from pathlib import Path

    example = (Path(__file__).resolve().parents[1] / "fsd.example.toml").read_text()
    line = next(ln for ln in example.splitlines() if ln.startswith("policy ="))
    choices = re.sub(r"\([^)]*\)", "", line.split("#", 1)[1].split(";", 1)[0])
    named = {name.strip() for name in choices.split("|")}
    assert {"default", "fsd", "sj-mlfq", "fcfs"} <= named, line
    assert named - {"default"} <= set(POLICIES), named - set(POLICIES)
    assert "fsd start --help" in line

"""A policy's own settings, declared once on its queue class, reach it from every door:
the config, fsd.toml, the command lines, a retune and the simulator."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from fsd.config import CacheConfig, EngineConfig, SchedConfig
from fsd.config_checks import doc
from fsd.config_file import build_configs
from fsd.cost import CostModel
from fsd.cost.profiles import load_profile
from fsd.errors import ConfigError, SettingError
from fsd.sched import registry
from fsd.sched.retune import plan_retune
from fsd.sched.sorted_queues import FCFSQueue
from fsd.sim.runner import RunSpec
from fsd.study.gittins_queue import GittinsQueue
from fsd.workload import gamma, length_model, synthetic
from tests.sched.harness import make_jobs, scheduler
from tests.sched.test_mlfq import cost


@dataclass(frozen=True)
class ToySettings:
    """A toy policy's one setting."""

    stride: int = doc(1, "Take every stride-th job first.")


class ToyQueue(FCFSQueue):
    """FCFS with a setting: what a new policy with one setting is (its class, one line)."""

    Settings = ToySettings

    def __init__(self, cost: CostModel, settings: ToySettings) -> None:
        super().__init__(cost)
        self.name, self.stride = "toy", settings.stride


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {**registry.POLICY_TABLE, "toy": registry.Policy(ToyQueue, ToySettings)}  # the one line
    monkeypatch.setattr(registry, "POLICY_TABLE", table)
    monkeypatch.setattr(registry, "POLICIES", tuple(table))


def test_a_new_policy_gets_its_setting_from_the_toml_table_and_keywords(toy, tmp_path):
    toml = tmp_path / "fsd.toml"
    toml.write_text('[sched]\npolicy = "toy"\n[sched.toy]\nstride = 3\n')
    engine, _, _ = build_configs(toml)
    assert engine.sched.policy_settings == (("toy.stride", 3),)
    assert registry.make_queue(engine.sched, cost()).stride == 3
    # a command line's value (text) wins over the file's, read as the field's type
    engine, _, _ = build_configs(toml, policy_settings=["toy.stride=5"])
    assert registry.make_queue(engine.sched, cost()).stride == 5
    keywords = EngineConfig.from_kwargs(policy="toy", **{"toy.stride": 7})
    assert registry.make_queue(keywords.sched, cost()).stride == 7
    assert registry.make_queue(SchedConfig(policy="toy"), cost()).stride == 1  # its default


def test_a_bad_setting_is_refused_with_the_nearest_name_or_the_wanted_type(toy):
    with pytest.raises(ConfigError, match=r"toy\.strid .*did you mean toy\.stride"):
        registry.check_policies(SchedConfig(policy_settings={"toy.strid": 2}), CacheConfig())
    with pytest.raises(ConfigError, match="toy setting stride must be an integer"):
        registry.check_policies(SchedConfig(policy_settings={"toy.stride": 1.5}), CacheConfig())
    with pytest.raises(ConfigError, match="toy.stride must be int"):
        registry.make_queue(SchedConfig(policy="toy", policy_settings=["toy.stride=x"]), cost())
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        SchedConfig(policy_settings=["stride"])
    # a setting of a policy that is not running is still checked: a retune to it must not fail
    with pytest.raises(ConfigError, match="unknown policy setting fcfs.x"):
        registry.check_policies(SchedConfig(policy_settings={"fcfs.x": 1}), CacheConfig())


def test_the_gittins_rules_are_its_settings_and_each_changes_what_the_simulator_does():
    work = synthetic(gamma(6.0, 4.0), length_model("mix:sharegpt+code-bursty:0.5"), 400, 1)
    work = work.clipped(2048)
    profile = load_profile("opt-13b-a100")

    def finishes(**own: object) -> list[float]:
        sched = SchedConfig(
            policy="gittins", policy_settings={f"gittins.{k}": v for k, v in own.items()}
        )
        res = RunSpec("gittins", sched, CacheConfig()).simulator(profile).run(work)
        return sorted(j.finish_time for j in res.jobs)

    plain = finishes()
    assert finishes(guard=True, lift=True, by_prompt=True) == plain  # the defaults, spelled out
    assert finishes(guard=False) != plain
    queue = registry.make_queue(
        SchedConfig(policy="gittins", policy_settings={"gittins.lift": "off"}), cost()
    )
    assert isinstance(queue, GittinsQueue) and queue.guard and not queue.lift


def test_a_retune_changes_one_setting_of_a_running_queue_and_keeps_its_jobs():
    s = scheduler(policy="gittins")
    jobs = make_jobs([(8, 4), (8, 4), (8, 4)])
    for j in jobs:
        s.add(j, 0.0)
    before = s.queue
    new, _ = plan_retune(s.config, s.cache, {"gittins.guard": False})
    assert new is not None and new.policy_settings == (("gittins.guard", False),)
    s.retune(1.0, new)
    assert s.queue is before and not s.queue.guard and s.queue.lift  # adopted in place
    assert [j.job_id for j in s.queue.ordered()] == [j.job_id for j in jobs]
    again, _ = plan_retune(new, s.cache, {"gittins.lift": False})
    assert again is not None and dict(again.policy_settings) == {
        "gittins.guard": False,
        "gittins.lift": False,
    }
    with pytest.raises(SettingError, match="gittins.guard must be bool"):
        plan_retune(new, s.cache, {"gittins.guard": "sometimes"})
    with pytest.raises(SettingError, match="did you mean gittins.lift"):
        plan_retune(new, s.cache, {"gittins.lfit": False})


def test_the_command_lines_list_each_setting_with_its_help_and_take_it():
    from fsd.cli import app

    runner = CliRunner()
    for command in ("start", "simulate"):
        out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"})
        assert out.exit_code == 0 and "gittins.guard (default True)" in out.output, command
    out = runner.invoke(
        app,
        [
            "simulate",
            "--policies",
            "gittins",
            "--limit",
            "20",
            "--policy-settings",
            "gittins.gard=0",
        ],
    )
    assert out.exit_code != 0 and "did you mean gittins.guard" in out.output

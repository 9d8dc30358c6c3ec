"""Policies over the block manager, driven without a model."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsd.config import CacheConfig, SchedConfig
from fsd.errors import ConfigError
from fsd.sched.registry import check_policies, resolve_policy
from fsd.sched.rules import MAX_ALPHA_SLOS
from tests.sched.harness import (
    drive,
    drive_all,
    job_specs,
    make_jobs,
    property_scheduler,
    scheduler,
)

POLICIES = ["fcfs", "priority", "mlfq", "sj-mlfq", "fsd", "gittins", "srpt"]
KV = ["defer", "recompute", "reactive", "proactive"]
RULED = ("sj-mlfq", "fsd")  # the policies with a demotion rule and a preemption threshold
NEVER = MAX_ALPHA_SLOS  # an alpha no run reaches: no promotion


def churn(policy: str) -> dict | None:
    """Demotion at every quantum's end, no preemption threshold (sj-mlfq's own rules):
    the churn that forces preemption and swapping."""
    return {"demote": "always", "threshold": 0} if policy in RULED else None


def test_fcfs_batch_one_runs_jobs_to_completion_in_arrival_order():
    s = scheduler("fcfs", max_batch_size=1)
    assert drive(s, make_jobs([(3, 5), (30, 2), (2, 9)])).finished == ["j0", "j1", "j2"]


@pytest.mark.parametrize("rule", ["always", "gittins"])
def test_sj_mlfq_lets_a_short_job_pass_a_long_one(rule):
    # (no preemption threshold: with 4 levels it would keep the running job ahead)
    s = scheduler(
        "sj-mlfq",
        max_batch_size=1,
        quanta=(1.0, 2.0, 4.0, 8.0),
        rules={"alpha": NEVER, "demote": rule},  # no promotion in these runs
    )
    for n in [2] * 24 + [60] * 8:  # gittins learned a heavy tail: outliving 2 tokens is bad news
        s.queue.lengths.observe(n)
    run = drive(s, make_jobs([(4, 40), (4, 3)]))
    assert run.finished == ["j1", "j0"]


@pytest.mark.parametrize(("threshold", "first"), [(0, "j1"), (3, "j0")])
def test_a_running_job_is_preempted_only_by_a_job_far_enough_ahead(threshold, first):
    # j0 runs first and is demoted level by level; with 4 levels and a threshold of 3
    # it always ranks at Q1, ahead of j1 waiting there, so it is never preempted
    s = scheduler(
        "sj-mlfq",
        max_batch_size=1,
        quanta=(1.0, 2.0, 4.0, 8.0),
        rules={"alpha": NEVER, "threshold": threshold},  # no promotion in these runs
    )
    jobs = make_jobs([(4, 40), (4, 3)])
    run = drive(s, jobs)
    assert run.finished[0] == first
    assert (jobs[0].preemptions > 0) == (threshold == 0)


def test_a_fresh_gittins_queue_runs_alike_jobs_first_come_first_served():
    # nothing finished yet: a job that has generated tokens keeps its place (cold start)
    s = scheduler("fsd", max_batch_size=1, quanta=(1.0, 2.0, 4.0, 8.0), rules={"alpha": NEVER})
    run = drive(s, make_jobs([(4, 20), (4, 20), (4, 20)]))
    assert run.finished == ["j0", "j1", "j2"]
    assert all(b == ["j0"] for b in run.batches[:20])


def test_priority_runs_shorter_prompts_first():
    s = scheduler("priority", max_batch_size=1)
    assert drive(s, make_jobs([(40, 2), (4, 2)])).finished == ["j1", "j0"]


def test_srpt_runs_the_least_remaining_work_first():
    s = scheduler("srpt", max_batch_size=1)
    assert drive(s, make_jobs([(4, 9), (4, 2), (4, 5)])).finished == ["j1", "j2", "j0"]


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="unknown policy 'lifo'.*sj-mlfq"):
        resolve_policy("lifo")
    assert resolve_policy("default") in POLICIES


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("policy", POLICIES)
def test_small_device_pool_every_policy_and_kv_policy_finishes_everything(policy, kv):
    s = scheduler(policy, kv, device=12, host=64, max_batch_size=3, rules=churn(policy))
    jobs = make_jobs([(6, 9), (3, 14), (9, 4), (2, 11), (7, 7), (4, 3)])
    arrivals = {j.job_id: 2 * i for i, j in enumerate(jobs)}
    run = drive(s, jobs, arrivals, copy_delay=2)
    assert sorted(run.finished) == sorted(j.job_id for j in jobs)
    assert all(len(j.output_token_ids) == j.max_output for j in jobs)
    assert s.blocks.device.num_free == 12 and s.blocks.host.num_free == 64
    if kv in ("reactive", "proactive") and policy in ("mlfq", "sj-mlfq"):
        assert sum(j.swaps_out for j in jobs) > 0
        assert all(j.recomputes == 0 for j in jobs)
    if kv == "recompute" and policy in ("mlfq", "sj-mlfq"):
        assert sum(j.recomputes for j in jobs) > 0


@settings(max_examples=40, deadline=None)
@given(
    job_specs(24, 24, 10),
    st.sampled_from(POLICIES),
    st.sampled_from(KV),
    st.integers(1, 4),
    st.integers(8, 30),
    st.integers(0, 3),
    st.one_of(st.none(), st.lists(st.integers(1, 30), min_size=32, max_size=40)),
    st.sampled_from([0, 1, 3]),
)
def test_property_blocks_conserved_all_finish_no_deadlock(
    specs, policy, kv, batch, device, delay, learned, threshold
):
    # learned: output lengths that prime the Gittins demotion rule (None: always demote)
    rules = {"demote": "always" if learned is None else "gittins", "threshold": threshold}
    s = property_scheduler(policy, kv, device, batch, rules=rules if policy in RULED else None)
    lengths = getattr(s.queue, "lengths", None)  # MLFQ queues only
    if lengths is not None:
        for n in learned or ():
            lengths.observe(n)
    drive_all(s, specs, copy_delay=delay)  # every job finishes, every block comes back


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="strictly increasing"):
        SchedConfig(quanta=(1.0, 1.0))


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("fsd.alpha", 0, r"fsd setting alpha must be in \(0, 1e\+06\] SLOs, got 0"),
        ("sj-mlfq.alpha", 2e6, r"sj-mlfq setting alpha must be in \(0, 1e\+06\] SLOs"),
        ("fsd.waiting_alpha", -1.0, r"fsd setting waiting_alpha must be in \(0, 1e\+06\]"),
        ("fsd.threshold", -1, r"fsd setting threshold must be in \[0, 256\] levels, got -1"),
        ("fsd.promote", "up2", "fsd setting promote must be one of"),
        ("mlfq.promote", "down", "mlfq setting promote must be one of"),
        ("fsd.demote", "never", "fsd setting demote must be one of"),
        ("fsd.charge_prefill", "maybe", "fsd.charge_prefill must be bool"),
    ],
)
def test_a_bad_policy_setting_is_refused_by_name(setting, value, words):
    # the policy's settings check themselves, whichever policy runs
    with pytest.raises(ConfigError, match=words):
        check_policies(SchedConfig(policy_settings={setting: value}), CacheConfig())


@pytest.mark.parametrize(("fraction", "e_starts"), [(1.0, 1), (0.5, 10)])
def test_admission_holds_new_jobs_while_started_ones_fill_the_share(fraction, e_starts):
    # 4 jobs of 7 blocks (28 tokens) start first; e (8 blocks) arrives at iteration 1.
    # Under admit_fraction 0.5 of 64 blocks, 28 + 8 > 32: e waits for the four to
    # finish (their 10th token is at iteration 9), though the device has room.
    s = scheduler("sj-mlfq", device=64, host=0, admit_fraction=fraction, rules={"alpha": NEVER})
    jobs = make_jobs([(28, 10)] * 4 + [(28, 2)])
    run = drive(s, jobs, arrivals={"j4": 1})
    first = next(i for i, b in enumerate(run.batches) if "j4" in b)
    assert first == e_starts
    assert sorted(run.finished) == [f"j{i}" for i in range(5)]


def test_admission_never_refuses_a_job_when_nothing_else_holds_kv():
    s = scheduler("sj-mlfq", device=32, host=0, admit_fraction=0.1)
    assert drive(s, make_jobs([(100, 3)])).finished == ["j0"]


def test_busy_jobs_are_not_ready_not_preempted_and_keep_their_kv():
    # pipeline parallelism: a micro-batch in flight holds its jobs until it returns
    def run(busy: set[str]):
        s = scheduler("sj-mlfq", kv_policy="reactive", device=52, host=64, block_size=4)
        a, b = make_jobs([(200, 10), (12, 10)])  # a: 50 blocks, level 2; b: 3 blocks, level 1
        s.add(a, 0.0)
        first = s.schedule(0.0)
        assert first.batch == [a]
        if not busy:  # its iteration came back; in flight, it has not
            a.num_computed_tokens = a.num_tokens
            a.output_token_ids.append(1)
            s.update(first, 0.05)
        s.add(b, 0.0)  # b outranks a and needs a's room
        return a, b, s.schedule(0.1, busy={a.job_id} if busy else set())

    a, b, free = run(busy=False)
    assert free.batch == [b] and [op.job for op in free.swap_out] == [a] and a in free.preempted
    a, b, held = run(busy=True)
    assert held.batch == [] and a not in held.preempted
    assert a.kv.value == "device" and len(a.block_table) == 50 and held.swap_out == []


@pytest.mark.parametrize("to", ["defer", "recompute", "reactive"])
def test_retuning_away_from_proactive_brings_every_host_job_back(to):
    s = scheduler(
        kv_policy="proactive",
        device=16,
        max_batch_size=1,
    )
    jobs = make_jobs([(12, 20)] * 4)
    on_host: list[str] = []

    def retune_once_a_job_is_on_the_host(it: int, now: float) -> None:
        if not on_host and s.cache.kv_policy == "proactive":
            on_host.extend(j.job_id for j in jobs if j.kv.value == "host")
            if on_host:
                s.retune(now, cache=dataclasses.replace(s.cache, kv_policy=to))

    run = drive(
        s, jobs, arrivals={f"j{i}": i for i in range(4)}, before=retune_once_a_job_is_on_the_host
    )
    assert on_host and s.cache.kv_policy == to  # the retune happened with KV on the host
    assert sorted(run.finished) == ["j0", "j1", "j2", "j3"]
    assert s.blocks.host.num_free == s.blocks.host.num_blocks


def test_a_dropped_job_too_long_to_re_prefill_with_others_runs_alone():
    # each job alone fits the device (15 of 16 blocks) but not both: one is dropped
    # (recompute) after it has grown past max_batch_tokens, so its re-prefill of every
    # token so far cannot share an iteration; it runs alone instead of never
    s = scheduler(
        "fcfs", kv_policy="recompute", device=16, max_batch_size=2, max_batch_tokens=24,
        prefill_chunk=0,
    )  # fmt: skip
    jobs = make_jobs([(20, 40), (20, 40)])
    run = drive(s, jobs)
    assert sorted(run.finished) == ["j0", "j1"]
    assert any(j.recomputes for j in jobs)


def test_retuning_quanta_to_none_puts_back_the_levels_q1_and_the_ratio_derive():
    # explicit quanta override q1 x ratio; `quanta=none` (fsctl retune) undoes that
    s = scheduler("sj-mlfq", quanta=(1.0, 2.0), q1=0.5, quantum_ratio=3.0, num_levels=4)
    jobs = make_jobs([(4, 40)])
    s.add(jobs[0], 0.0)
    jobs[0].level = 1
    assert s.queue.quanta == [1.0, 2.0]
    s.retune(1.0, dataclasses.replace(s.config, quanta=None))
    assert s.queue.quanta == pytest.approx([0.5, 1.5, 4.5, 13.5])
    assert s.config.quanta is None and jobs[0].level == 1 and jobs[0] in s.queue

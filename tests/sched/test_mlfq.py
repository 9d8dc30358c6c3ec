"""Hand-computed scheduling cases (paper §4.1-4.2, DESIGN §3-4)."""

from __future__ import annotations

import dataclasses

import pytest

from fsd.config import CacheConfig
from fsd.cost import CostModel
from fsd.jobs import Job, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.planner import SwapPlanner, by_enst_desc
from fsd.kv.policies import ArrivalEstimate
from fsd.sched.mlfq import MLFQQueue, build_quanta
from tests.sched.harness import make_jobs, scheduler

QUANTA = [1.0, 2.0, 4.0, 8.0]


def cost(decode: float = 1.0) -> CostModel:
    # prefill(n) = 1 + 0.01 n; a decode step costs `decode` whatever the batch
    return CostModel(
        prefill_base=1.0,
        prefill_per_token=0.01,
        decode_base=decode,
        decode_per_seq=0.0,
        decode_per_ctx_token=0.0,
    )


def job(prompt: int, name: str = "j") -> Job:
    return Job(prompt_token_ids=[1] * prompt, params=SamplingParams(max_tokens=100), job_id=name)


def run_once(q: MLFQQueue, j: Job, now: float) -> list[Job]:
    """Charge one iteration as the scheduler does, then append its token."""
    service = q.cost.job_iteration_time(j.num_new_tokens, j.num_tokens)
    j.last_prefill = j.num_computed_tokens == 0
    j.num_computed_tokens = j.num_tokens
    j.output_token_ids.append(0)
    return q.account([(j, service)], now)


def test_quanta_grow_by_the_ratio():
    assert build_quanta(0.5, 2.0, 4) == [0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize(("prompt", "level"), [(4, 1), (99, 1), (150, 2), (290, 2), (1000, 3)])
def test_skip_join_enters_the_highest_level_whose_quantum_covers_the_prefill(prompt, level):
    # t_init = 1 + 0.01 * prompt: 1.04 -> q2=2; 1.99 -> q2; 2.5 -> q3=4; 3.9 -> q3; 11 -> last
    q = MLFQQueue(cost(), QUANTA, starve_limit=100.0, skip_join=True)
    j = job(prompt)
    q.add(j, 0.0)
    assert j.level == level


def test_naive_mlfq_enters_q1_and_demotes_one_level_at_a_time():
    q = MLFQQueue(cost(decode=5.0), QUANTA, starve_limit=100.0, skip_join=False)
    j = job(50)  # prefill 1.5 > q1
    q.add(j, 0.0)
    assert j.level == 0
    assert run_once(q, j, 1.0) == [j] and j.level == 1 and j.attained == 0.0


def test_demotion_goes_to_the_level_that_covers_the_next_iteration():
    q = MLFQQueue(cost(decode=5.0), QUANTA, starve_limit=100.0, charge_prefill=True)
    j = job(50)  # prefill 1.5 -> Q2 (q=2)
    q.add(j, 0.0)
    assert j.level == 1
    assert run_once(q, j, 1.0) == []  # attained 1.5 < 2: stays
    assert j.level == 1 and j.attained == pytest.approx(1.5)
    # attained 6.5 >= 2; the next decode takes 5, so Q3 (q=4) is skipped for Q4 (q=8)
    assert run_once(q, j, 2.0) == [j]
    assert j.level == 3 and j.attained == 0.0 and j.demotions == 1


def test_a_prefill_is_not_charged_so_the_entry_quantum_is_for_decoding():
    q = MLFQQueue(cost(decode=0.5), QUANTA, starve_limit=100.0)
    j = job(150)  # prefill 2.5 -> Q3 (q=4); charged, 2.5 + 3 decodes would demote it
    q.add(j, 0.0)
    assert j.level == 2
    assert run_once(q, j, 1.0) == [] and j.attained == 0.0
    for t in range(2, 9):  # 7 decodes of 0.5 = 3.5 < 4
        assert run_once(q, j, float(t)) == []
    assert j.level == 2 and j.attained == pytest.approx(3.5)
    assert run_once(q, j, 9.0) == [j] and j.level == 3  # the 8th spends the quantum


def test_demotion_is_at_least_one_level():
    q = MLFQQueue(cost(decode=0.1), QUANTA, starve_limit=100.0, skip_join=True)
    j = job(4)  # Q2
    q.add(j, 0.0)
    run_once(q, j, 1.0)  # the prefill: free
    run_once(q, j, 2.0)  # 0.1 -> still < 2
    for t in range(3, 40):
        run_once(q, j, float(t))
        if j.level != 1:
            break
    assert j.level == 2  # the decode of 0.1 would fit Q1, but demotion only goes down


def test_starved_job_moves_up_one_level_per_alpha():
    q = MLFQQueue(cost(), QUANTA, starve_limit=10.0)  # promote_to="up1", fsd's default
    j = job(1000)
    q.add(j, 0.0)
    assert j.level == 3
    assert q.tick(9.99) == []
    assert q.tick(10.0) == [j] and j.level == 2 and j.promotions == 1
    assert q.tick(19.99) == [] and q.tick(20.0) == [j] and j.level == 1
    assert q.tick(30.0) == [j] and j.level == 0
    assert q.tick(40.0) == [] and j.level == 0 and j.promotions == 3  # nowhere higher


def test_starved_job_is_promoted_to_q1_after_alpha_and_the_clock_restarts():
    q = MLFQQueue(cost(), QUANTA, starve_limit=10.0, skip_join=True, promote_to="top")
    j = job(1000)
    q.add(j, 0.0)
    assert j.level == 3
    assert q.tick(9.99) == []
    assert q.tick(10.0) == [j]
    assert j.level == 0 and j.attained == 0.0 and j.promotions == 1
    assert q.tick(19.99) == []  # waited 9.99 since the promotion
    assert list(q.ordered()) == [j]


def test_a_job_that_has_not_started_starves_after_the_waiting_alpha():
    q = MLFQQueue(cost(), QUANTA, starve_limit=10.0, waiting_limit=2.0)
    waiting, started, top = job(1000, "w"), job(1000, "s"), job(1, "t")
    for j in (waiting, started, top):
        q.add(j, 0.0)
    run_once(q, started, 0.0)  # its prefill: a token out, still level 3 (not charged)
    assert waiting.level == started.level == 3 and top.level == 0
    # ENST = min(promotion, work above = q1 + q2 + q3 = 7): each job's own alpha counts
    enst = q.enst([waiting, started], now=0.5, batch_size=1)
    assert enst == {"w": pytest.approx(1.5), "s": pytest.approx(7.0)}
    assert q.tick(1.99) == [] and q.tick(2.0) == [waiting] and waiting.level == 2
    assert q.tick(4.0) == [waiting] and q.tick(6.0) == [waiting] and waiting.level == 0
    assert q.tick(9.99) == [] and q.tick(10.0) == [started] and started.level == 2


def test_a_retuned_waiting_alpha_applies_to_jobs_already_queued():
    q = MLFQQueue(cost(), QUANTA, starve_limit=10.0, waiting_limit=10.0)
    j = job(1000)
    q.add(j, 0.0)
    assert q.adopt(MLFQQueue(cost(), QUANTA, starve_limit=10.0, waiting_limit=2.0))
    assert q.tick(2.0) == [j]


@pytest.mark.parametrize(("threshold", "order"), [(0, "yxr"), (1, "yxr"), (2, "yrx"), (3, "ryx")])
def test_preemption_threshold_ranks_the_running_jobs_levels_up(threshold, order):
    q = MLFQQueue(cost(), QUANTA, starve_limit=1e9, preempt_threshold=threshold)
    r, x, y = job(1000, "r"), job(1, "x"), job(1, "y")
    for j in (r, x, y):
        q.add(j, 0.0)
    q._place(x, 1)  # by hand: r in Q4, x in Q2, y in Q1
    assert (r.level, x.level, y.level) == (3, 1, 0)
    q.set_running([r])
    # r ranks at level 3 - threshold, ahead of the jobs already there
    assert "".join(j.job_id for j in q.ordered()) == order
    assert sorted([r, x, y], key=q.key) == list(q.ordered())
    q.set_running([])
    assert "".join(j.job_id for j in q.ordered()) == "yxr"


def test_naive_mlfq_has_one_alpha_and_no_preemption_threshold():
    q = MLFQQueue(
        cost(), QUANTA, starve_limit=10.0, skip_join=False, waiting_limit=2.0, preempt_threshold=3
    )
    assert q.waiting_limit == 10.0 and q.preempt_threshold == 0


def test_running_resets_the_starvation_clock():
    q = MLFQQueue(cost(), QUANTA, starve_limit=10.0, skip_join=True)
    j = job(1000)
    q.add(j, 0.0)
    run_once(q, j, 8.0)
    assert q.tick(17.0) == [] and q.tick(18.0) == [j]


def test_enst_is_the_min_of_promotion_time_and_work_above():
    q = MLFQQueue(cost(), QUANTA, starve_limit=100.0, skip_join=False)
    a, b, c, i = (job(1, n) for n in "abci")
    for x in (a, b, c, i):
        q.add(x, 0.0)
    # move c to Q2 and i to Q3 by hand (placement is tested above)
    q._place(c, 1)
    q._place(i, 2)
    # T_exec(i) = (1/B) [ 2 jobs x (q1 + q2) + 1 job x q2 ] = (1/2)(2*3 + 2) = 4
    enst = q.enst([a, c, i], now=0.0, batch_size=2)
    assert enst["a"] == 0.0
    assert enst["c"] == pytest.approx((2 * 1.0) / 2)
    assert enst["i"] == pytest.approx(4.0)
    # waited 98.5 of alpha=100: promotion in 1.5 comes before the 4 of work above
    assert q.enst([i], now=98.5, batch_size=2)["i"] == pytest.approx(1.5)


def test_reserve_is_max_of_k_and_top_queue_jobs_times_blocks_per_new_job():
    planner = planner_for(
        BlockManager(100, 4), CacheConfig(reserve_min_jobs=2, reserve_top_levels=1), per_job=5.0
    )
    assert planner.reserve_blocks(top_level_jobs=1) == 10  # K = 2 dominates
    assert planner.reserve_blocks(top_level_jobs=3) == 15  # a burst in the top queue
    assert planner.reserve_blocks(top_level_jobs=50) == 50  # never more than half the pool


def planner_for(blocks: BlockManager, cache: CacheConfig, per_job: float = 1.0) -> SwapPlanner:
    arrivals = ArrivalEstimate()
    arrivals.blocks_per_job = per_job
    return SwapPlanner(blocks, cache, arrivals)


def _plan(planner, movable, wanted, upcoming, enst, reserve, in_flight, max_blocks=None):
    """The planner over `movable` (device-resident jobs outside the batch)."""
    return planner.plan(
        wanted, upcoming, enst, reserve, in_flight, max_blocks, lambda: by_enst_desc(movable, enst)
    )


def _pools(device: int, on_device: str, on_host: str) -> tuple[BlockManager, dict[str, Job]]:
    blocks = BlockManager(device, 4, 40)
    jobs = {n: job(8, n) for n in on_device + on_host}  # 2 blocks each
    for n in on_host:  # through the device to the host, before the device fills
        blocks.allocate(jobs[n])
        blocks.swap_out(jobs[n], sync=True)
    for n in on_device:
        blocks.allocate(jobs[n])
    return blocks, jobs


ENST = {"a": 5.0, "b": 9.0, "c": 1.0, "d": 0.5, "e": 7.0}


def enst_of(job: Job) -> float:
    return ENST[job.job_id]


def test_planner_keeps_the_reserve_by_swapping_out_the_largest_enst():
    blocks, jobs = _pools(10, "abc", "de")
    # 4 of 10 blocks free; a reserve of 6 needs one job (2 blocks) out: b, the largest ENST
    ops = _plan(
        planner_for(blocks, CacheConfig()),
        [jobs[n] for n in "abc"],
        [],
        [jobs["d"], jobs["e"]],
        enst_of,
        6,
        {},
    )
    assert [(op.direction, op.job.job_id) for op in ops] == [("out", "b")]


def test_planner_brings_upcoming_jobs_in_while_the_reserve_holds():
    blocks, jobs = _pools(20, "", "de")
    ops = _plan(planner_for(blocks, CacheConfig()), [], [], [jobs["d"], jobs["e"]], enst_of, 2, {})
    assert [(op.direction, op.job.job_id) for op in ops] == [("in", "d"), ("in", "e")]
    blocks2, jobs2 = _pools(6, "", "de")  # 6 free: d fits (4 left >= 2), e would break it
    ops = _plan(
        planner_for(blocks2, CacheConfig()), [], [], [jobs2["d"], jobs2["e"]], enst_of, 3, {}
    )
    assert [op.job.job_id for op in ops] == ["d"]


def test_a_wanted_job_evicts_only_jobs_expected_later_than_itself():
    blocks, jobs = _pools(6, "abc", "d")  # device full
    # d (ENST 0.5) is wanted now and needs 2 blocks: b, the largest ENST, makes the room
    ops = _plan(
        planner_for(blocks, CacheConfig(reserve_min_jobs=0)),
        [jobs[n] for n in "abc"],
        [jobs["d"]],
        [],
        enst_of,
        0,
        {},
    )
    assert [(op.direction, op.job.job_id) for op in ops] == [("out", "b")]
    # a wanted job expected later than every resident job evicts nobody (no thrashing)
    ENST_LATE = {**ENST, "d": 0.9, "a": 0.3, "b": 0.4, "c": 0.2}
    blocks, jobs = _pools(6, "abc", "d")
    ops = _plan(
        planner_for(blocks, CacheConfig()),
        [jobs[n] for n in "abc"],
        [jobs["d"]],
        [],
        lambda j: ENST_LATE[j.job_id],
        0,
        {},
    )
    assert ops == []


def test_planner_respects_the_link_budget():
    blocks, jobs = _pools(10, "abc", "")
    ops = _plan(
        planner_for(blocks, CacheConfig()),
        [jobs[n] for n in "abc"],
        [],
        [],
        enst_of,
        10,
        {},
        max_blocks=4,
    )
    assert [op.job.job_id for op in ops] == ["b", "a"]  # 4 blocks, then the link is full


def test_a_host_job_larger_than_the_link_budget_comes_in_alone():
    blocks, jobs = _pools(10, "", "de")  # 2 blocks each on the host, the device empty
    planner = planner_for(blocks, CacheConfig())
    # the budget is 1 block: d comes in alone rather than never; e waits its turn
    ops = _plan(planner, [], [jobs["d"]], [jobs["e"]], enst_of, 0, {}, max_blocks=1)
    assert [(op.direction, op.job.job_id) for op in ops] == [("in", "d")]
    # while a copy is moving, an oversize job waits for the link to clear
    moving = {"d": ops[0]}
    assert _plan(planner, [], [jobs["e"]], [], enst_of, 0, moving, max_blocks=1) == []


def test_the_swap_budget_is_sized_by_the_batch_paying_the_fixed_cost_once():
    cost = CostModel(
        name="fixed", decode_base=0.02, decode_per_seq=1e-4, decode_per_ctx_token=1e-6,
        prefill_base=0.02, prefill_per_token=1e-4, kv_bytes_per_token=1000,
    )  # fmt: skip
    s = scheduler(cost=cost, device=1024, host=1024, block_size=4, max_batch_size=8)
    jobs = make_jobs([(10, 20)] * 7 + [(30, 20)])
    for j in jobs[:7]:
        s.add(j, 0.0)
    out = s.schedule(0.0)  # 7 prefills
    assert s._last_batch_cost == pytest.approx(cost.iteration_time([10] * 7, []))
    for j in out.batch:
        j.num_computed_tokens = j.num_tokens
        j.output_token_ids.append(1)
    s.update(out, 1.0)
    s.add(jobs[7], 1.0)
    out = s.schedule(1.0)  # 7 decodes and a prefill of 30: one weight read, not 8
    assert len(out.batch) == 8
    want = cost.iteration_time([30], [11] * 7)
    assert s._last_batch_cost == pytest.approx(want)
    assert want < 2 * cost.decode_base


def test_fewer_levels_after_a_retune_keep_the_queue_order_its_keys_give():
    s = scheduler(num_levels=8)
    jobs = make_jobs([(400, 5), (4, 5), (200, 5), (8, 5)])  # long prompts skip-join low
    for j in jobs:
        s.add(j, 0.0)
    assert len({j.level for j in jobs}) >= 3
    s.retune(0.0, dataclasses.replace(s.config, num_levels=2))
    ordered = list(s.queue.ordered())
    assert {j.level for j in ordered} <= {0, 1}
    assert ordered == sorted(ordered, key=s.queue.key)  # the scheduler relies on it

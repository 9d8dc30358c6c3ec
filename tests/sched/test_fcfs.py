"""FCFS driven without a model: each iteration appends one token per batched job."""

from hypothesis import given, settings
from hypothesis import strategies as st

from fsd.config import SchedConfig
from fsd.jobs import FinishReason, Job, JobStatus, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.sched import make_scheduler


def drive(sched, bm, jobs, max_iters=10_000):
    for j in jobs:
        sched.add(j)
    order, it = [], 0
    while sched.has_unfinished():
        it += 1
        assert it < max_iters, "no progress"
        out = sched.schedule(float(it))
        assert out.batch, "an empty batch while jobs wait is a deadlock here"
        assert len(out.batch) <= sched.config.max_batch_size
        for j in out.batch:
            assert len(j.block_table) * bm.block_size >= j.num_tokens
            j.num_computed_tokens = j.num_tokens
            j.output_token_ids.append(1)
            if len(j.output_token_ids) >= j.max_output:
                j.finish(FinishReason.LENGTH, float(it))
                order.append(j.job_id)
        sched.update(out, float(it))
        bm.check()
    return order


def make(prompt_lens, outputs):
    return [
        Job(prompt_token_ids=[5] * p, params=SamplingParams(max_tokens=o), job_id=f"j{i}")
        for i, (p, o) in enumerate(zip(prompt_lens, outputs, strict=True))
    ]


def test_batch_size_one_runs_jobs_to_completion_in_arrival_order():
    bm = BlockManager(64, 4)
    sched = make_scheduler(SchedConfig(policy="fcfs", max_batch_size=1), bm)
    jobs = make([3, 30, 2], [5, 2, 9])
    assert drive(sched, bm, jobs) == ["j0", "j1", "j2"]


def test_small_pool_preempts_newest_by_recompute_and_loses_nothing():
    bm = BlockManager(6, 4)
    sched = make_scheduler(SchedConfig(policy="fcfs", max_batch_size=4), bm)
    jobs = make([4, 4, 4], [12, 12, 12])
    drive(sched, bm, jobs)
    assert all(len(j.output_token_ids) == 12 for j in jobs)
    assert sum(j.recomputes for j in jobs) > 0
    assert jobs[0].recomputes == 0  # the oldest job is never the victim
    assert bm.num_free == 6


def test_remove_frees_a_waiting_or_running_job():
    bm = BlockManager(8, 4)
    sched = make_scheduler(SchedConfig(policy="fcfs", max_batch_size=1), bm)
    a, b = make([4, 4], [3, 3])
    sched.add(a)
    sched.add(b)
    out = sched.schedule(0.0)
    assert out.batch == [a] and a.status is JobStatus.RUNNING
    sched.remove(a)
    sched.remove(b)
    assert not sched.has_unfinished() and bm.num_free == 8


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=12),
    st.integers(1, 6),
    st.integers(10, 40),
)
def test_every_job_finishes_and_blocks_are_conserved(specs, batch, pool):
    bm = BlockManager(pool, 4)
    sched = make_scheduler(SchedConfig(policy="fcfs", max_batch_size=batch), bm)
    # jobs that could never fit the pool alone are refused by the engine before this point
    specs = [(p, o) for p, o in specs if bm.blocks_for(p + o) <= pool] or [(1, 1)]
    jobs = make([p for p, _ in specs], [o for _, o in specs])
    drive(sched, bm, jobs)
    assert all(len(j.output_token_ids) == j.max_output for j in jobs)
    assert bm.num_free == pool

"""Drives a Scheduler without a model: each iteration appends one token per batched
job (a prefill chunk short of the prompt's end, none); asynchronous copies end
`copy_delay` iterations after they start."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from fsd.config import CacheConfig, SchedConfig
from fsd.cost import CostModel
from fsd.jobs import Job, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.sched.registry import make_scheduler
from fsd.sched.scheduler import Scheduler
from tests.costs import linear_cost

COST = linear_cost("unit", prefill=(1.0, 0.01), decode=(1.0, 0.0, 0.0), kv_bytes_per_token=1)


def job_specs(max_prompt: int, max_output: int, max_jobs: int) -> st.SearchStrategy:
    """Hypothesis: lists of (prompt, output, arrival iteration) for `make_jobs`/`drive`."""
    return st.lists(
        st.tuples(st.integers(1, max_prompt), st.integers(1, max_output), st.integers(0, 30)),
        min_size=1,
        max_size=max_jobs,
    )


_first_token = itertools.count(5)  # a token no other job starts with: no shared prefix


def make_jobs(specs: list[tuple[int, int]], prefix: str = "j") -> list[Job]:
    return [
        Job(
            prompt_token_ids=[next(_first_token)] + [5] * (p - 1),
            params=SamplingParams(max_tokens=o),
            job_id=f"{prefix}{i}",
            oracle_output_len=o,
        )
        for i, (p, o) in enumerate(specs)
    ]


def scheduler(
    policy: str = "sj-mlfq",
    kv_policy: str = "proactive",
    device: int = 64,
    host: int = 256,
    block_size: int = 4,
    cost: CostModel = COST,
    admit_fraction: float = 0.9,
    rules: dict | None = None,
    **sched_kw,
) -> Scheduler:
    """`rules`: the policy's own settings by field name (`{"demote": "always"}`)."""
    blocks = BlockManager(device, block_size, host)
    cache = CacheConfig(block_size=block_size, kv_policy=kv_policy, admit_fraction=admit_fraction)
    own = {f"{policy}.{k}": v for k, v in (rules or {}).items()}
    config = SchedConfig(policy=policy, policy_settings=own, **sched_kw)
    return make_scheduler(config, cache, blocks, cost)


def property_scheduler(
    policy: str, kv_policy: str, device: int, batch: int, **sched_kw
) -> Scheduler:
    """The random-arrival property tests' scheduler: `device` blocks of 4 tokens, a host
    pool of 200, at most `batch` jobs an iteration, and `sched_kw`."""
    return scheduler(policy, kv_policy, device, 200, 4, max_batch_size=batch, **sched_kw)


@dataclass
class Run:
    finished: list[str] = field(default_factory=list)
    iterations: int = 0
    batches: list[list[str]] = field(default_factory=list)


def drive(
    sched: Scheduler,
    jobs: list[Job],
    arrivals: dict[str, int] | None = None,
    copy_delay: int = 1,
    max_iters: int = 20_000,
    before: Callable[[int, float], None] | None = None,
) -> Run:
    """Run to completion; arrivals maps job id -> iteration it arrives (default 0).
    `before(iteration, now)` runs ahead of each decision (a live retune, say)."""
    arrivals = arrivals or {}
    pending = sorted(jobs, key=lambda j: arrivals.get(j.job_id, 0))
    copies: list[tuple[int, object]] = []
    run = Run()
    now = 0.0
    while pending or sched.has_unfinished() or copies:
        it = run.iterations
        assert it < max_iters, "no progress"
        while pending and arrivals.get(pending[0].job_id, 0) <= it:
            sched.add(pending.pop(0), now)
        for due, op in list(copies):
            if due <= it:
                sched.swap_done(op)
                copies.remove((due, op))
        if before is not None:
            before(it, now)
        out = sched.schedule(now)
        copies += [(it + copy_delay, op) for op in out.swap_out + out.swap_in if not op.sync]
        for job in out.batch:
            assert job.kv.value == "device"
            fed = job.num_computed_tokens + job.step_tokens  # a chunk needs blocks to its end
            assert len(job.block_table) * sched.blocks.block_size >= fed
            assert not job.host_block_table
            if not job.step_samples:  # a prefill chunk short of the end
                job.absorb_chunk()
                continue
            job.append_token(1, now)  # the engine's and the simulator's rule
            reason, _ = job.stop_after(1, (), 1 << 62)
            if reason is not None:
                job.finish(reason, now)
                run.finished.append(job.job_id)
        run.batches.append([j.job_id for j in out.batch])
        now += max(1.0, sum(j.last_cost for j in out.batch))
        sched.update(out, now)
        sched.blocks.check()
        run.iterations += 1
    return run


def drive_all(
    sched: Scheduler,
    specs: list[tuple[int, int, int]],
    copy_delay: int = 1,
    before: Callable[[int, float], None] | None = None,
) -> list[Job]:
    """The (prompt, output, arrival) `specs` whose prompt and output fit the device pool
    (admission's rule; one tiny job if none does), run to completion on a fresh `sched`:
    every job finishes and every block of both tiers is free again. Returns the jobs."""
    blocks = sched.blocks
    fit = [s for s in specs if blocks.blocks_for(s[0] + s[1]) <= blocks.device.num_blocks]
    fit = fit or [(1, 1, 0)]
    jobs = make_jobs([(p, o) for p, o, _ in fit])
    arrivals = {j.job_id: a for j, (_, _, a) in zip(jobs, fit, strict=True)}
    run = drive(sched, jobs, arrivals, copy_delay=copy_delay, before=before)
    assert sorted(run.finished) == sorted(j.job_id for j in jobs)
    assert blocks.device.num_free == blocks.device.num_blocks
    assert blocks.host.num_free == blocks.host.num_blocks
    return jobs

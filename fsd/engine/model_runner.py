"""Turns a scheduled batch into one model step and one sampled token per job."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fsd.engine.kv_cache import KVCachePool
from fsd.engine.output import JobFault
from fsd.engine.plan import flatten
from fsd.engine.sampler import Sampler
from fsd.jobs import Job
from fsd.layers.attention import AttentionMetadata


class ModelRunner:
    """Builds the flat batch (decodes first), runs the model, samples."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVCachePool,
        sampler: Sampler,
        device: torch.device,
        eos_ids: frozenset[int],
    ) -> None:
        self.model = model
        self.pool = pool
        self.sampler = sampler
        self.device = device
        self.eos_ids = tuple(sorted(eos_ids))

    @torch.inference_mode()
    def execute(self, batch: Sequence[Job]) -> list[int | JobFault]:
        """Run one iteration over `batch`; return the sampled token of each job, in order.

        A job whose sampling failed gets a JobFault instead of a token. Sampling never
        raises out of here, so an exception from execute means no job has drawn yet:
        the executor may re-run the jobs (see LocalExecutor.submit).
        """
        flat = flatten(batch)
        order, jobs, input_ids, positions = flat.order, flat.jobs, flat.input_ids, flat.positions
        meta = AttentionMetadata.build(
            query_lens=[j.num_new_tokens for j in jobs],
            context_lens=[j.num_tokens for j in jobs],
            block_tables=[j.block_table for j in jobs],
            block_size=self.pool.block_size,
            device=self.device,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids, pos, self.pool.layers, meta)
        last = (meta.query_start_loc[1:] - 1).long()
        logits = self.model.compute_logits(hidden[last])
        sampled: list[int | JobFault]
        try:
            sampled = self.sampler.sample(
                logits,
                [j.params for j in jobs],
                [j.job_id for j in jobs],
                banned=[self._banned(j) for j in jobs],
            )
        except Exception as exc:  # noqa: BLE001 - some rows may have drawn: never re-run
            sampled = [JobFault.of("sampling", exc)] * len(jobs)
        tokens: list[int | JobFault] = [0] * len(batch)
        for k, i in enumerate(order):
            tokens[i] = sampled[k]
        return tokens

    def _banned(self, job: Job) -> tuple[int, ...]:
        return banned_tokens(job, self.eos_ids)


def banned_tokens(job: Job, eos_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Tokens that would end the job before its min_tokens."""
    if len(job.output_token_ids) >= job.params.min_tokens:
        return ()
    eos = () if job.params.ignore_eos else eos_ids
    return eos + job.params.stop_token_ids

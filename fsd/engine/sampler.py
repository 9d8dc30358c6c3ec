"""Next-token sampling for a batch of jobs with per-job parameters.

Greedy rows take the argmax. Random rows apply temperature, top-k and top-p in one
batched pass, then draw: the rows without a seed in one draw from the engine's
generator; a job with a seed from its own generator, so its tokens do not depend on
what else shares the batch.

Sampling one row never raises and never fails another row (DESIGN: a serving engine
loop never dies from one job):
- NaN never wins an argmax (+inf does: an overflowed logit is the model's strongest
  preference); a row where no logit is usable takes token 0;
- a random row whose probabilities are not a distribution (NaN or inf logits, every
  token banned, an overflow at a low temperature) draws its argmax instead;
- if the batched pass raises, each row is redone alone, and a row that still raises,
  or whose draw raises, comes back as a `JobFault` in place of its token;
- anything else that goes wrong turns every row into a JobFault: `sample` never
  raises, so a caller that sees an exception knows no row has drawn.

This is the only place a token is drawn: the worker that holds the last pipeline
stage (in process, or TP rank 0 of the last stage on Ray) samples its logits here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fsd.engine.output import JobFault
from fsd.jobs import SamplingParams
from fsd.layers.attention import upload


@dataclass
class Drawn:
    """A step's drawn tokens, on the device, with their copy to the host under way:
    the next step can read them there before the host has (`values` waits)."""

    tokens: torch.Tensor | None  # [rows] int64; None: every row failed
    faults: dict[int, JobFault] = field(default_factory=dict)
    _host: torch.Tensor | None = None
    _event: torch.cuda.Event | None = None

    @classmethod
    def of(cls, tokens: torch.Tensor, faults: dict[int, JobFault] | None = None) -> Drawn:
        drawn = cls(tokens, faults or {})
        if tokens.is_cuda:  # start the copy now; the host reads it when it must
            drawn._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            drawn._host.copy_(tokens, non_blocking=True)
            drawn._event = torch.cuda.Event()
            drawn._event.record()
        return drawn

    @classmethod
    def listed(cls, rows: Sequence[int | JobFault]) -> Drawn:
        """Rows drawn one by one on the host (the slow path)."""
        values = [0 if isinstance(r, JobFault) else r for r in rows]
        faults = {i: r for i, r in enumerate(rows) if isinstance(r, JobFault)}
        return cls(torch.tensor(values, dtype=torch.long), faults)

    def values(self, n: int) -> list[int | JobFault]:
        """The `n` rows' tokens on the host (a failed row: its JobFault)."""
        if self.tokens is None:
            return [self.faults[0]] * n
        if self._event is not None:
            self._event.synchronize()
        host = self._host if self._host is not None else self.tokens
        out: list[int | JobFault] = list(host.tolist())
        for i, fault in self.faults.items():
            out[i] = fault
        return out


class Sampler:
    """Holds the engine-wide generator and the per-job seeded generators."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._job_generators: dict[str, torch.Generator] = {}

    def forget(self, job_id: str) -> None:
        self._job_generators.pop(job_id, None)

    def seed_state(self, job_id: str) -> torch.Tensor | None:
        """A seeded job's generator state (None: it has drawn nothing, or has no seed)."""
        gen = self._job_generators.get(job_id)
        return None if gen is None else gen.get_state()

    def restore(self, job_id: str, params: SamplingParams, state: torch.Tensor | None) -> None:
        """A job moved here from another engine goes on drawing where it stopped."""
        if state is not None:
            self._generator_for(job_id, params).set_state(state)

    def _generator_for(self, job_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.generator
        gen = self._job_generators.get(job_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
            self._job_generators[job_id] = gen
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        job_ids: Sequence[str],
        banned: Sequence[Sequence[int]] = (),
        greedy: torch.Tensor | None = None,
    ) -> list[int | JobFault]:
        """One token per row of `logits` [N, vocab], or a JobFault for a row that failed.

        `banned[i]` lists token ids row i may not produce yet (EOS before min_tokens).
        Each row draws at most once, so a seeded job's generator advances one step.
        `greedy` (`greedy_tokens(logits)`, drawn where the logits were made) is taken
        as it is when every row is greedy and none bans a token. Never raises (see the
        module docstring).
        """
        return self.draw(logits, params, job_ids, banned, greedy).values(len(params))

    def draw(self, logits: torch.Tensor, params: Sequence[SamplingParams], job_ids: Sequence[str],
             banned: Sequence[Sequence[int]] = (), greedy: torch.Tensor | None = None) -> Drawn:  # fmt: skip
        """`sample`, without waiting for the device: the tokens stay where they were
        drawn until `Drawn.values` reads them."""
        if greedy is not None and all(p.greedy for p in params) and not any(banned):
            return Drawn.of(greedy)
        try:
            ban: list[Sequence[int]] = list(banned) or [()] * len(params)
            try:
                tokens, probs, random_rows = _prepare(logits, params, ban)
            except Exception:  # noqa: BLE001 - one row's bad input must not fail the others
                return Drawn.listed(self._rows_alone(logits, params, job_ids, ban))
            return self._draw(tokens, probs, random_rows, params, job_ids)
        except Exception as exc:  # noqa: BLE001 - some rows may have drawn: never re-run
            return Drawn(None, {0: JobFault.of("sampling", exc)})

    def _rows_alone(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        job_ids: Sequence[str],
        banned: Sequence[Sequence[int]],
    ) -> list[int | JobFault]:
        """The slow path after the batched pass raised: each row on its own."""
        out: list[int | JobFault] = []
        for i in range(len(params)):
            try:
                tokens, probs, rows = _prepare(logits[i : i + 1].clone(), [params[i]], [banned[i]])
            except Exception as exc:  # noqa: BLE001 - reported as this job's fault
                out.append(JobFault.of("sampling", exc))
                continue
            out += self._draw(tokens, probs, rows, [params[i]], [job_ids[i]]).values(1)
        return out

    def _draw(
        self,
        tokens: torch.Tensor,
        probs: torch.Tensor | None,
        random_rows: list[int],
        params: Sequence[SamplingParams],
        job_ids: Sequence[str],
    ) -> Drawn:
        faults: dict[int, JobFault] = {}
        alone = range(len(random_rows))  # positions in random_rows (and rows of probs)
        shared = [k for k in alone if params[random_rows[k]].seed is None]
        if probs is not None and len(shared) > 1:  # one draw from the engine's generator
            try:
                rows = _on(probs.device, shared)
                drawn = torch.multinomial(probs[rows], 1, generator=self.generator)[:, 0]
                tokens[_on(tokens.device, [random_rows[k] for k in shared])] = drawn
                alone = [k for k in alone if params[random_rows[k]].seed is not None]
            except Exception:  # noqa: BLE001 - each row on its own, below
                pass
        for k in alone:
            i = random_rows[k]
            assert probs is not None
            try:
                gen = self._generator_for(job_ids[i], params[i])
                tokens[i] = torch.multinomial(probs[k], 1, generator=gen)[0]
            except Exception as exc:  # noqa: BLE001 - reported as this job's fault
                faults[i] = JobFault.of("sampling", exc)
        return Drawn.of(tokens, faults)


def _on(device: torch.device, values: Sequence[float], dtype: type = np.int64) -> torch.Tensor:
    """Host values on the device without waiting for it (pinned, not blocking)."""
    return upload(np.asarray(values, dtype=dtype), device)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row, where a NaN never wins (a row of NaN gives token 0)."""
    return logits.masked_fill(logits.isnan(), float("-inf")).argmax(dim=-1)


def _prepare(
    logits: torch.Tensor, params: Sequence[SamplingParams], banned: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """Ban, then the argmax of every row and the probabilities of the random rows.

    Every returned probability row is a distribution torch.multinomial accepts: one
    that is not (NaN, inf, nothing left) is replaced by a one-hot on its argmax.
    """
    logits = logits.float()
    for i, ids in enumerate(banned):
        if ids:
            logits[i, _on(logits.device, ids)] = float("-inf")
    tokens = greedy_tokens(logits)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not random_rows:
        return tokens, None, []
    rows = _on(logits.device, random_rows)
    probs = _filtered_probs(logits[rows], [params[i] for i in random_rows])
    valid = torch.isfinite(probs).all(dim=-1, keepdim=True) & (probs.sum(-1, keepdim=True) > 0)
    argmax = torch.zeros_like(probs).scatter_(-1, tokens[rows].unsqueeze(-1), 1.0)
    return tokens, torch.where(valid, probs, argmax), random_rows


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    dev = logits.device
    temps = _on(dev, [p.temperature for p in params], np.float32).unsqueeze(1)
    logits = logits / temps
    vocab = logits.shape[-1]
    top_k = _on(dev, [p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_p = _on(dev, [p.top_p for p in params], np.float32)
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):  # (no wait for the device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = ranks >= top_k.unsqueeze(1)
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p. The first token always
        # stays: a top_p below float32's range (1e-300) rounds to 0 here.
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= (mass_before >= top_p.unsqueeze(1)) & (ranks > 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits.softmax(dim=-1)

"""Next-token sampling for a batch of jobs with per-job parameters.

Greedy rows take the argmax. Random rows apply temperature, top-k and top-p in one
batched pass, then draw one token each; a job with a seed draws from its own
generator, so its tokens do not depend on what else shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fsd.jobs import SamplingParams


class Sampler:
    """Holds the engine-wide generator and the per-job seeded generators."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._job_generators: dict[str, torch.Generator] = {}

    def forget(self, job_id: str) -> None:
        self._job_generators.pop(job_id, None)

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
    ) -> list[int]:
        """One token per row of `logits` [N, vocab] (float32).

        `banned[i]` lists token ids row i may not produce yet (EOS before min_tokens).
        """
        logits = logits.float()
        for i, ids in enumerate(banned):
            if ids:
                logits[i, list(ids)] = float("-inf")
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            probs = _filtered_probs(logits[rows], [params[i] for i in random_rows])
            for k, i in enumerate(random_rows):
                gen = self._generator_for(job_ids[i], params[i])
                tokens[i] = torch.multinomial(probs[k], 1, generator=gen)[0]
        return tokens.tolist()


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    temps = torch.tensor([p.temperature for p in params], device=logits.device).unsqueeze(1)
    logits = logits / temps
    vocab = logits.shape[-1]
    top_k = torch.tensor(
        [p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device
    )
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = ranks >= top_k.unsqueeze(1)
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits.softmax(dim=-1)

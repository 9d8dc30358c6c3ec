"""The job profiler's cost model: predicted iteration time (pure Python, no torch).

FastServe's skip-join rests on iteration time being predictable from the shapes
alone. Prefill time grows with input length (linear for the MLPs, quadratic for
attention); a decode step costs a fixed part (reading the weights) plus a part per
sequence and a part per cached token (reading the KV). The engine fits these
coefficients from measurements (`fsd profile`); the simulator loads them from JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fsd.errors import ConfigError, read_parsed


@dataclass(frozen=True)
class CostModel:
    """Seconds per iteration as a function of the batch's shape.

    prefill(n)          = prefill_base + prefill_per_token * n + prefill_per_token2 * n^2
    chunk(n, c)         = prefill(n) + c * (decode_per_ctx_token + prefill_per_ctx_token * n)
    decode(b, ctx_sum)  = decode_base + decode_per_seq * b + decode_per_ctx_token * ctx_sum
    A mixed iteration costs the decode part plus each prefill's part beyond the base.

    A prefill chunk of n tokens over c cached ones (chunked prefill) also reads the c
    cached tokens' KV once (as a decode does) and attends n x c more pairs. Summed
    over a prompt's chunks the n x c pairs add up to the whole prompt's n^2 term
    (when prefill_per_ctx_token = 2 x prefill_per_token2, the math alone); what
    chunking adds is re-reading the cached KV once per chunk and, when a chunk runs
    alone, its prefill_base: `chunked_prefill_time` says by how much.
    Swapping moves kv_bytes_per_token per token at swap_bytes_per_s (one direction at a time).

    With pipeline parallelism the times are an iteration's latency through all
    `pipeline_stages` stages; each stage is busy for 1/pipeline_stages of it, so that
    many micro-batches can be in flight at once (see `stage_time`).
    """

    name: str = "unnamed"
    prefill_base: float = 1e-3
    prefill_per_token: float = 1e-5
    prefill_per_token2: float = 0.0
    prefill_per_ctx_token: float = 0.0  # a chunk's query token x cached token
    decode_base: float = 1e-3
    decode_per_seq: float = 1e-5
    decode_per_ctx_token: float = 1e-8
    kv_bytes_per_token: int = 0
    swap_bytes_per_s: float = 16e9
    pipeline_stages: int = 1  # the PP degree the times pass through (1: no pipeline)
    notes: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for key in (
            "prefill_base",
            "prefill_per_token",
            "prefill_per_token2",
            "prefill_per_ctx_token",
            "decode_base",
            "decode_per_seq",
            "decode_per_ctx_token",
            "kv_bytes_per_token",
        ):
            if not getattr(self, key) >= 0:  # (NaN too)
                raise ConfigError(f"profile {self.name!r}: {key} must be >= 0")
        if self.swap_bytes_per_s <= 0:
            raise ConfigError(f"profile {self.name!r}: swap_bytes_per_s must be > 0")
        stages = self.pipeline_stages
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise ConfigError(
                f"profile {self.name!r}: pipeline_stages must be an integer >= 1, got {stages!r}"
            )

    # ---- predictions -----------------------------------------------------------

    def prefill_time(self, num_tokens: int) -> float:
        n = num_tokens
        return self.prefill_base + self.prefill_per_token * n + self.prefill_per_token2 * n * n

    def chunk_time(self, num_tokens: int, cached: int) -> float:
        """A prefill chunk of `num_tokens` new tokens over `cached` ones, run alone."""
        t = self.prefill_time(num_tokens)
        return t + self._over_cached(num_tokens, cached) if cached else t

    def _over_cached(self, num_tokens: int, cached: int) -> float:
        """What a chunk adds for its cached tokens: reading them, attending over them."""
        return cached * (self.decode_per_ctx_token + self.prefill_per_ctx_token * num_tokens)

    def chunked_prefill_time(self, num_tokens: int, chunk: int) -> float:
        """A whole prompt prefilled in chunks of at most `chunk` tokens, each one in
        an iteration of its own (alone: each pays prefill_base). chunk <= 0: whole."""
        if chunk <= 0 or chunk >= num_tokens:
            return self.prefill_time(num_tokens)
        total, done = 0.0, 0
        while done < num_tokens:
            n = min(chunk, num_tokens - done)
            total += self.chunk_time(n, done)
            done += n
        return total

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        return (
            self.decode_base
            + self.decode_per_seq * batch_size
            + self.decode_per_ctx_token * context_tokens
        )

    @property
    def min_iteration_time(self) -> float:
        """A decode step at batch 1 with an empty context: the default q1."""
        return self.decode_time(1, 1)

    def decode_line(self) -> tuple[float, float]:
        """(a, b): one job's decode step alone takes a + b x its context, exactly as
        `job_iteration_time(1, context)` computes it."""
        return self.decode_base + self.decode_per_seq, self.decode_per_ctx_token

    def job_iteration_time(self, new_tokens: int, context_tokens: int) -> float:
        """One job's next iteration run alone: its prefill (or chunk: `new_tokens` of
        the `context_tokens` after the step are new), or one decode step."""
        if new_tokens > 1:
            if new_tokens < context_tokens:
                return self.chunk_time(new_tokens, context_tokens - new_tokens)
            return self.prefill_time(new_tokens)
        # decode_time(1, context_tokens), inlined: the scheduler calls this per job per step
        return self.decode_base + self.decode_per_seq + self.decode_per_ctx_token * context_tokens

    def iteration_time(
        self,
        prefill_lens: Iterable[int],
        decode_contexts: Iterable[int],
        prefill_cached: Iterable[int] = (),
    ) -> float:
        """A mixed batch: prefills (or chunks) of the given lengths plus decodes at the
        given contexts. `prefill_cached[i]`: tokens already cached before prefill i's
        chunk (none given: whole prefills).

        The fixed cost (reading the weights) is paid once per iteration.
        """
        ctx = list(decode_contexts)
        lens = list(prefill_lens)
        if not ctx and not lens:
            return 0.0
        t = self.decode_base if ctx else self.prefill_base
        t += self.decode_per_seq * len(ctx) + self.decode_per_ctx_token * sum(ctx)
        for n in lens:
            t += self.prefill_per_token * n + self.prefill_per_token2 * n * n
        for n, cached in zip(lens, prefill_cached, strict=False):
            if cached:
                t += self._over_cached(n, cached)
        return t

    def iteration_time_from_alone(self, alone_sum: float, decodes: int, prefills: int) -> float:
        """`iteration_time` from the sum of the batch's `job_iteration_time`s: the fixed
        part is paid once per iteration, not once per job (the scheduler sums per job)."""
        fixed = decodes * self.decode_base + prefills * self.prefill_base
        once = self.decode_base if decodes else self.prefill_base if prefills else 0.0
        return alone_sum - fixed + once

    def stage_time(self, prefill_lens: Iterable[int], decode_contexts: Iterable[int]) -> float:
        """How long the batch holds one pipeline stage: its latency over the stages.

        Stages hold equal shares of the layers, so each takes an equal share of the
        time (the hop between stages and the LM head on the last one are spread evenly).
        """
        return self.iteration_time(prefill_lens, decode_contexts) / self.pipeline_stages

    def swap_time(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    # ---- persistence -----------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, data: dict, source: str = "profile") -> CostModel:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown profile field(s) {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        p = Path(path)
        data = read_parsed(p, "profile file", "JSON", json.loads, json.JSONDecodeError)
        if not isinstance(data, dict):
            raise ConfigError(f"profile file {str(p)!r} must hold a JSON object")
        return cls.from_dict(data, source=str(p))

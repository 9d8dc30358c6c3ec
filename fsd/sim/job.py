"""A `Job` that knows only its token counts, for simulating large traces cheaply.

The scheduler and the block manager read token *counts* (`num_prompt_tokens`,
`num_tokens`, `num_new_tokens`, `len(output_token_ids)`), never the ids. A real
`Job` would hold 19k x 1k prompt ids for the Azure trace; `SimJob` keeps two ints.
"""

from __future__ import annotations

from collections.abc import Iterator

from fsd.jobs import Job, SamplingParams

# Shared by every simulated job: the output bound lives in `max_output`.
_PARAMS = SamplingParams(max_tokens=1 << 30, ignore_eos=True)


class TokenCount:
    """Stands in for a list of output token ids: `append` and `len` keep a count only.

    `append` also advances its owner's `num_tokens` (a plain attribute on `SimJob`: the
    scheduler reads it for every queued job every iteration)."""

    __slots__ = ("n", "owner")

    def __init__(self, owner: SimJob | None = None, n: int = 0) -> None:
        self.n = n
        self.owner = owner

    def append(self, _token: int) -> None:
        self.n += 1
        if self.owner is not None:
            self.owner.num_tokens += 1

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[int]:
        return iter([0] * self.n)

    def __repr__(self) -> str:
        return f"TokenCount({self.n})"


class SimJob(Job):
    """A job of `prompt_len` prompt tokens that will generate exactly `output_len` tokens.

    `oracle_output_len` is set (srpt reads it); token ids, where anything asks, are 0.
    `num_tokens` is an attribute kept by whoever adds a token (`TokenCount.append`,
    the simulator's token loop), not a property.
    """

    num_tokens: int = 0  # shadows Job's property: instance attribute, read hot

    def __init__(self, job_id: str, arrival: float, prompt_len: int, output_len: int) -> None:
        super().__init__(
            prompt_token_ids=[],
            params=_PARAMS,
            job_id=job_id,
            arrival_time=arrival,
            max_output=output_len,
            oracle_output_len=output_len,
        )
        self.prompt_len = prompt_len
        self.num_tokens = prompt_len
        self.output_token_ids = TokenCount(self)  # type: ignore[assignment]

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_len

    @property
    def num_new_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.output_token_ids.n  # type: ignore[attr-defined]

    @property
    def all_token_ids(self) -> list[int]:
        return [0] * self.num_tokens

    # ---- timings the metrics read ------------------------------------------------

    @property
    def latency(self) -> float:
        """End-to-end seconds from arrival to the last token."""
        assert self.finish_time is not None, f"{self.job_id} has not finished"
        return self.finish_time - self.arrival_time

    @property
    def per_token_latency(self) -> float:
        """End-to-end latency divided by the output tokens (the paper's metric, §6.1)."""
        return self.latency / self.max_output

    @property
    def ttft(self) -> float:
        assert self.first_token_time is not None, f"{self.job_id} produced no token"
        return self.first_token_time - self.arrival_time

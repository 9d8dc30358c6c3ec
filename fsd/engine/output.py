"""What the engine hands back: per-iteration deltas, the whole result of a job, and
what each iteration did."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from fsd.jobs import Job
from fsd.token_chunk import Chunk

_MAX_MESSAGE = 500  # an exception's text can hold a whole tensor: clip it


@dataclass(frozen=True)
class JobFault:
    """A job whose step failed on its own, in place of its token.

    The sampler and the executor return one for the row that failed; the engine then
    ends that job with FinishReason.ERROR and `message`, and the batch goes on.
    `detail` (the traceback) goes to the log only.
    """

    message: str
    detail: str = field(default="", compare=False, repr=False)

    @classmethod
    def of(cls, what: str, exc: BaseException) -> JobFault:
        """`what` failed with `exc`: a one-line message and the traceback."""
        return cls(
            describe(f"{what} failed", exc),
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


def describe(what: str, exc: BaseException) -> str:
    """'what: ExcType: message', clipped to a line a client can be shown."""
    try:
        said = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        said = "(unprintable)"
    text = " ".join(f"{what}: {type(exc).__name__}: {said}".split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


@dataclass(frozen=True)
class IterationStats:
    """What one iteration did (kept for benches and telemetry)."""

    start: float
    duration: float
    batch_size: int
    prefill_tokens: int
    decode_tokens: int


class StepDelta:
    """What one iteration produced for one job: its new tokens in the wire's own form
    (`chunk`, made once here; the daemon's router only addresses it), and on the job's
    last delta the whole result (`output`, timings included)."""

    __slots__ = ("chunk", "output")

    def __init__(
        self, job_id: str, new_token_ids: Sequence[int], new_text: str,
        output: RequestOutput | None = None,
    ) -> None:  # fmt: skip
        self.chunk = Chunk(job_id=job_id, token_ids=list(new_token_ids), text=new_text)
        self.output = output

    @property
    def job_id(self) -> str:
        return self.chunk.job_id

    @property
    def new_token_ids(self) -> list[int]:
        return self.chunk.token_ids

    @property
    def new_text(self) -> str:
        return self.chunk.text

    @property
    def finished(self) -> bool:
        return self.output is not None


@dataclass
class RequestOutput:
    """The whole result of one prompt, with timings and scheduling counts."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    error: str | None = None  # why the job failed (finish_reason "error")
    cached_tokens: int = 0  # prompt tokens its first prefill reused from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def per_token_latency(self) -> float | None:
        """End-to-end latency divided by output tokens (the paper's metric)."""
        lat = self.latency
        return None if lat is None or not self.token_ids else lat / len(self.token_ids)

    @classmethod
    def of(cls, job: Job, text: str) -> RequestOutput:
        return cls(
            request_id=job.job_id,
            prompt=job.prompt,
            prompt_token_ids=list(job.prompt_token_ids),
            text=text,
            token_ids=list(job.output_token_ids),
            finish_reason=job.finish_reason.value if job.finish_reason else None,
            arrival_time=job.arrival_time,
            first_token_time=job.first_token_time,
            finish_time=job.finish_time,
            token_times=list(job.token_times),
            preemptions=job.preemptions,
            swaps_out=job.swaps_out,
            swaps_in=job.swaps_in,
            recomputes=job.recomputes,
            error=job.error,
            cached_tokens=job.num_cached_tokens,
        )

"""What the engine hands back: per-iteration deltas and the whole result of a job."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsd.jobs import Job


@dataclass(frozen=True)
class StepDelta:
    """What one iteration produced for one job (streamed to its client at once).

    `output` is set on the job's last delta: the whole result, timings included.
    """

    job_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    output: RequestOutput | None = None

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
        )

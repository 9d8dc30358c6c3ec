"""Jobs (one per request) and their sampling parameters.

A job's life: WAITING → RUNNING ⇄ PREEMPTED → FINISHED. Its KV residency is tracked
separately (`KVLocation`) because a preempted job may keep its KV on the device,
move it to the host tier, or drop it for recomputation.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from fsd.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k <= 0 and top_p == 1 disable those filters.
    A `seed` makes a job's random draws reproducible on its own, whatever else is batched.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        # Accept lists for convenience; keep the frozen value hashable.
        object.__setattr__(self, "stop", _as_tuple(self.stop, "stop", str))
        object.__setattr__(
            self, "stop_token_ids", _as_tuple(self.stop_token_ids, "stop_token_ids", int)
        )
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _as_tuple(value: object, name: str, kind: type) -> tuple:
    if isinstance(value, kind):
        value = (value,)
    try:
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be a list of {kind.__name__}") from None
    if not all(isinstance(v, kind) for v in items):
        raise ConfigError(f"{name} must be a list of {kind.__name__}, got {value!r}")
    return items


class JobStatus(enum.Enum):
    WAITING = "waiting"  # never run, or preempted with its KV dropped
    RUNNING = "running"  # in this iteration's batch
    PREEMPTED = "preempted"  # started, not in the batch; KV kept (device or host)
    FINISHED = "finished"

    @property
    def finished(self) -> bool:
        return self is JobStatus.FINISHED


class KVLocation(enum.Enum):
    NONE = "none"
    DEVICE = "device"
    SWAPPING_OUT = "swapping-out"
    HOST = "host"
    SWAPPING_IN = "swapping-in"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"
    ERROR = "error"


_ids = itertools.count()


@dataclass(eq=False)
class Job:
    """One request inside the engine: tokens, KV blocks, timing and accounting."""

    prompt_token_ids: list[int]
    params: SamplingParams
    job_id: str = field(default_factory=lambda: f"job-{next(_ids)}")
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.time)
    max_output: int = 0  # max_tokens clipped to the model's context
    tags: tuple[str, ...] = ()
    oracle_output_len: int | None = None  # known only to the simulator (srpt)

    output_token_ids: list[int] = field(default_factory=list)
    status: JobStatus = JobStatus.WAITING
    kv: KVLocation = KVLocation.NONE
    block_table: list[int] = field(default_factory=list)  # device blocks
    host_block_table: list[int] = field(default_factory=list)  # host blocks
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None

    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    recomputes: int = 0
    swaps_out: int = 0
    swaps_in: int = 0

    # scheduling state, owned by the queue policy
    level: int = 0
    attained: float = 0.0  # profiled service at the current level (seconds)
    queue_seq: int = 0  # FIFO position within its level / queue
    last_run: float = 0.0  # when it last ran (or arrived)
    starve_since: float = 0.0  # when its starvation clock started
    enst: float | None = None  # estimated next scheduled time, seconds from now
    last_cost: float = 0.0  # profiled time of the iteration it was last scheduled for
    last_prefill: bool = False  # that iteration was a (re)prefill
    promotions: int = 0
    demotions: int = 0

    def __post_init__(self) -> None:
        if not self.max_output:
            self.max_output = self.params.max_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_new_tokens(self) -> int:
        """Tokens this job feeds the model in its next iteration."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_prefill(self) -> bool:
        return self.num_new_tokens > 1

    def finish(
        self, reason: FinishReason, now: float, stop_reason: str | int | None = None
    ) -> None:
        self.status = JobStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finish_time = now

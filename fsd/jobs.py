"""Jobs (one per request) and their sampling parameters.

A job's life: WAITING → RUNNING ⇄ PREEMPTED → FINISHED. Its KV residency is tracked
separately (`KVLocation`) because a preempted job may keep its KV on the device,
move it to the host tier, or drop it for recomputation.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import numbers
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from fsd.errors import ConfigError

# Bounds of the sampling fields. Every field is checked once, here, so that nothing
# a client sends can reach the sampler as NaN, inf or a value torch refuses.
MAX_INT32 = 2**31 - 1
# torch.Generator.manual_seed takes any unsigned 64-bit seed, and msgpack (the wire)
# carries it: the one seed range of every entry point (SDK, fsctl, ZeroMQ, HTTP)
MAX_SEED = 2**64 - 1
# An output token the model is still drawing (scheduled one step ahead: fsd.engine.ahead)
PENDING = -1
# Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS): dividing logits by
# 1e-46 would turn them into inf and the probabilities into NaN.
GREEDY_BELOW = 1e-5
# OpenAI's range, the one range every entry point takes (SDK, fsctl, ZeroMQ, HTTP):
# past 2 the draw of a real model is close to uniform, and a client meant otherwise.
MAX_TEMPERATURE = 2.0
# The stop-string check runs on every token of the job: keep its work bounded.
MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 1024
MAX_STOP_TOKEN_IDS = 256


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 (or below GREEDY_BELOW) means greedy. top_k <= 0 and top_p == 1
    disable those filters. A `seed` makes a job's random draws reproducible on its
    own, whatever else is batched. Every field is validated on construction
    (ConfigError naming the field); numbers are stored as plain int / float.
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
        put = object.__setattr__  # frozen: normalise in place once
        put(self, "max_tokens", _int(self.max_tokens, "max_tokens", 1, MAX_INT32))
        temperature = _real(self.temperature, "temperature")
        if not 0.0 <= temperature <= MAX_TEMPERATURE:
            raise ConfigError(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {_show(temperature)}"
            )
        put(self, "temperature", temperature)
        put(self, "top_k", _int(self.top_k, "top_k", -1, MAX_INT32))
        top_p = _real(self.top_p, "top_p")
        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {_show(top_p)}")
        put(self, "top_p", top_p)
        if self.seed is not None:
            put(self, "seed", _int(self.seed, "seed", 0, MAX_SEED))
        put(self, "min_tokens", _int(self.min_tokens, "min_tokens", 0, self.max_tokens))
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"ignore_eos must be true or false, got {_show(self.ignore_eos)}")
        # Accept lists for convenience; keep the frozen value hashable.
        stop = _as_tuple(self.stop, "stop", str, "string", MAX_STOP_STRINGS)
        for s in stop:
            if not 0 < len(s) <= MAX_STOP_LEN:
                raise ConfigError(
                    f"stop strings must be non-empty and at most {MAX_STOP_LEN} characters, "
                    f"got one of {len(s)}"
                )
        put(self, "stop", stop)
        ids = _as_tuple(
            self.stop_token_ids, "stop_token_ids", numbers.Integral, "token id", MAX_STOP_TOKEN_IDS
        )
        put(self, "stop_token_ids", tuple(_int(t, "stop_token_ids", 0, MAX_INT32) for t in ids))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


_SHARED_PARAMS: dict[tuple[SamplingParams, float], SamplingParams] = {}
_SHARED_MAX = 256  # distinct settings kept; past it the table starts again


def shared_params(params: SamplingParams) -> SamplingParams:
    """The one object of parameters equal to `params` (frozen, so jobs may share it):
    a flood of jobs sent with the same settings holds one, not one per job.
    A temperature of -0.0 stays apart from 0.0 (equal, but shown otherwise)."""
    key = (params, math.copysign(1.0, params.temperature))
    kept = _SHARED_PARAMS.get(key)
    if kept is not None:
        return kept
    if len(_SHARED_PARAMS) >= _SHARED_MAX:
        _SHARED_PARAMS.clear()
    _SHARED_PARAMS[key] = params
    return params


def _show(value: object, limit: int = 60) -> str:
    """A value for an error message: clipped, and safe for ints too long to print."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit
        return f"an integer of {value.bit_length()} bits"  # type: ignore[attr-defined]
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {_show(value)}")
    value = int(value)
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be in [{lo}, {hi}], got {_show(value)}")
    return value


def _real(value: object, name: str) -> float:
    """A finite float (ints accepted); NaN, +-inf and bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number, got {_show(value)}")
    return number


def _as_tuple(value: object, name: str, kind: type, label: str, max_len: int) -> tuple:
    """A single `kind` or a list of them (at most `max_len`) as a tuple."""
    if isinstance(value, kind) and not isinstance(value, bool):
        value = (value,)
    items: tuple | None = None
    if not isinstance(value, str | bytes | dict):  # iterable, but never a list of them
        with contextlib.suppress(TypeError):
            items = tuple(value)  # type: ignore[arg-type]
    if items is not None and len(items) > max_len:
        raise ConfigError(f"{name} may hold at most {max_len} items, got {len(items)}")
    if items is None or not all(isinstance(v, kind) and not isinstance(v, bool) for v in items):
        raise ConfigError(f"{name} must be a {label} or a list of them, got {_show(value)}")
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


@dataclass(eq=False, slots=True)
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
    owner: str | None = None  # whose job it is: owners take turns in a level (fair_share)

    output_token_ids: list[int] = field(default_factory=list)
    status: JobStatus = JobStatus.WAITING
    kv: KVLocation = KVLocation.NONE
    block_table: list[int] = field(default_factory=list)  # device blocks
    # host blocks; a job without: the one empty tuple, not a list of its own (`token_times`)
    host_block_table: list[int] = ()  # type: ignore[assignment]
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens its first prefill found in the prefix cache
    prefix_hint: int = 0  # tokens the prefix cache held at arrival (skip-join reads it)
    prefix_uids: list[int] = field(default_factory=list)  # names of its leading full blocks
    table_epoch: int = 0  # +1 whenever block_table changes other than by growing
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # why it ended with FinishReason.ERROR

    first_token_time: float | None = None
    finish_time: float | None = None
    # when each output token came; none yet: the one empty tuple (56 B a queued job less)
    token_times: list[float] = ()  # type: ignore[assignment]
    preemptions: int = 0
    recomputes: int = 0
    swaps_out: int = 0
    swaps_in: int = 0

    # scheduling state, owned by the queue policy
    level: int = 0
    attained: float = 0.0  # profiled service at the current level (seconds)
    queue_seq: int = 0  # FIFO position within its level / queue
    fair_round: int = 0  # its owner's turn within its level (fsd.sched.fair_share)
    last_run: float = 0.0  # when it last ran (or arrived)
    starve_since: float = 0.0  # when its starvation clock started
    enst: float | None = None  # estimated next scheduled time, seconds from now
    # profiled time of the iteration it was last scheduled for (a prefill chunk: its share
    # of the whole prefill, so the chunks of a prompt are charged what it would be whole)
    last_cost: float = 0.0
    last_prefill: bool = False  # that iteration was a (re)prefill or a chunk of one
    step_tokens: int = 0  # tokens fed in that iteration (a prefill chunk may be fewer)
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

    def token_ids(self, start: int, end: int) -> list[int]:
        """`all_token_ids[start:end]` without joining the whole prompt and output."""
        prompt, n = self.prompt_token_ids, len(self.prompt_token_ids)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return prompt[start:] + self.output_token_ids[: end - n]

    def block_content(self, index: int, block_size: int) -> tuple[int, ...] | None:
        """The token ids of full block `index` (None past the last full block): what the
        prefix cache names the block by (fsd.kv.prefix)."""
        lo, hi = index * block_size, (index + 1) * block_size
        prompt = self.prompt_token_ids
        if hi <= len(prompt):
            return tuple(prompt[lo:hi])
        if hi > self.num_tokens:
            return None
        return tuple(self.token_ids(lo, hi))

    @property
    def is_prefill(self) -> bool:
        return self.num_new_tokens > 1

    @property
    def num_prefilled(self) -> int:
        """Prompt tokens whose KV is cached (prefill progress; the prompt once started)."""
        return min(self.num_computed_tokens, self.num_prompt_tokens)

    @property
    def step_samples(self) -> bool:
        """The scheduled step reaches the job's last token, so the model samples one.

        Only a prefill chunk short of the end does not: the step fills KV and the job
        produces nothing (`absorb_chunk`).
        """
        return self.num_computed_tokens + self.step_tokens >= self.num_tokens

    def absorb_chunk(self) -> None:
        """A prefill chunk short of the end ran: its tokens are cached, none produced.

        The rule the engine and the simulator share for a step that does not sample.
        """
        self.num_computed_tokens += self.step_tokens

    def append_token(self, token: int, now: float) -> None:
        """The model produced `token` at `now`: every token fed so far is in the cache.

        The one rule the engine and the simulator share for a produced token.
        """
        self.num_computed_tokens = self.num_tokens
        self._store_token(token, now)
        if self.first_token_time is None:
            self.first_token_time = now

    def expect_token(self, now: float) -> None:
        """Its step is on the device: account a token whose value comes later
        (`resolve_token`), so the next step can be scheduled before it is drawn."""
        self.append_token(PENDING, now)

    def resolve_token(self, token: int, now: float) -> None:
        """The token `expect_token` stood for was drawn at `now`."""
        self.output_token_ids[-1] = token
        self.token_times[-1] = now
        if len(self.output_token_ids) == 1:
            self.first_token_time = now

    @property
    def pending(self) -> bool:
        """Its last output token is still being drawn (`expect_token`)."""
        out = self.output_token_ids
        return bool(out) and out[-1] == PENDING

    def drop_pending(self) -> None:
        """It ends before its pending token comes: the token is not its."""
        if self.pending:
            self.output_token_ids.pop()
            self.token_times.pop()
            if not self.output_token_ids:
                self.first_token_time = None

    def _store_token(self, token: int, now: float) -> None:
        self.output_token_ids.append(token)
        if self.token_times:
            self.token_times.append(now)
        else:
            self.token_times = [now]

    def stop_after(
        self, token: int, eos_ids: Collection[int], max_model_len: int
    ) -> tuple[FinishReason | None, str | int | None]:
        """Why the job ends after producing `token` (None: it goes on), and the stop.

        EOS and stop tokens count from `min_tokens` on; the length limit is
        `max_output` or the model's context, whichever comes first. Stop strings are
        the detokenizer's business (they can span tokens).
        """
        p = self.params
        n = self.num_output_tokens
        if n >= p.min_tokens:
            if not p.ignore_eos and token in eos_ids:
                return FinishReason.STOP, token
            if token in p.stop_token_ids:
                return FinishReason.STOP, token
        if n >= self.max_output or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def finish(
        self,
        reason: FinishReason,
        now: float,
        stop_reason: str | int | None = None,
        error: str | None = None,
    ) -> None:
        self.status = JobStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.error = error
        self.finish_time = now

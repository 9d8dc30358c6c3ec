"""Admission: whether a request is accepted, decided once, where it enters.

Every refusal of a request is raised here and nowhere else, so every entry (the SDK,
fsctl and the HTTP API over the daemon's socket, an injected burst or scenario, the
offline `fsd.LLM`, a replica set, the simulator) refuses the same requests with the
same words:

- `check_open`: a draining daemon takes no new job (`DrainingError`);
- `check_room`: the job caps, per client and daemon-wide (`OverloadedError`);
- `admit`: a request's form and prompt, tokenized once, then `check_request`; the
  admitted `JobRequest` carries its token ids and output bound to the engine, which
  trusts it (a replica behind the cluster face never tokenizes or checks it again);
- `check_request`: the length rule, also called on its own where requests are only
  lengths (the simulator, a scenario checked before it runs, a burst);
- `refuse_late`: off by default, a job predicted to wait more than `refuse_wait`
  seconds for its first token (with a retry hint), or to miss its SLO by `refuse_late`.

A job that could never be scheduled would wait forever and hold its client; hence
the checks on the model's context, one iteration and the device pool.

May import: fsd.errors and fsd.jobs only (no torch, no engine: the simulator uses it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from fsd.errors import ConfigError, FsdError, OverloadedError, PromptTooLongError
from fsd.jobs import Job, SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    """What bounds one request: the model's context, one iteration, the device pool."""

    max_model_len: int
    max_batch_tokens: int
    device_blocks: int
    block_size: int
    prefill_chunk: int = 0  # chunked prefill: a prompt need not fit one iteration
    context_note: str = ""  # why the context is what it is, if not the model's positions

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


@dataclass(frozen=True)
class JobRequest:
    """One request, from where it enters to the engine (the one shape it has).

    As asked: the prompt (text or token ids), its sampling, and how to take it (`clip`
    False: a max_tokens past the context is refused, not cut to it; `affinity`: with
    several replicas, the router keeps one key's jobs together). Once `admit` took
    it, `ids` holds the prompt's token ids and `max_output` its output bound: an
    engine queues an admitted request as it is.
    """

    prompt: str | Sequence[int]
    params: SamplingParams
    job_id: str | None = None  # None: the engine names it
    arrival: float | None = None  # None: now
    tags: Sequence[str] = ()
    clip: bool = True
    affinity: str | None = None
    owner: str | None = None  # whose job: owners take turns in a level (fsd.sched.fair_share)
    req_id: str | None = None  # the owner's name for the job (None: its job id)
    ids: tuple[int, ...] = ()  # the prompt's token ids (set by `admit`)
    max_output: int | None = None  # the output bound (set by `admit`; None: not admitted)

    @property
    def admitted(self) -> bool:
        return self.max_output is not None


class DrainingError(FsdError):
    """The daemon is draining: it accepts no new jobs."""

    code: ClassVar[str] = "draining"


def check_open(draining: bool) -> None:
    """Refuse (DrainingError) while the daemon drains."""
    if draining:
        raise DrainingError("the daemon is draining; it accepts no new jobs")


def check_room(
    count: int, mine: int, live: int, max_client_jobs: int, max_jobs: int, who: str
) -> None:
    """Refuse `count` more jobs past the client's cap (`mine` live now; `who` names
    what it counts by) or the daemon's (`live` now)."""
    if mine + count > max_client_jobs:
        raise OverloadedError(
            f"this client ({who}) has {mine} live jobs; max_client_jobs is {max_client_jobs}"
        )
    if live + count > max_jobs:
        raise OverloadedError(f"the daemon holds {live} live jobs; max_jobs is {max_jobs}")


def admit(request: JobRequest, limits: RequestLimits, tokenizer: Any, vocab: int) -> JobRequest:
    """`request` admitted: its prompt tokenized (text) or checked (ids), its sampling
    checked, its lengths held to `limits`; a clear FsdError if refused."""
    params = request.params
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    bad = [t for t in params.stop_token_ids if t >= vocab]
    if bad:  # an id past the logits would fail the job's every sampling step
        raise ConfigError(
            f"stop_token_ids must be below the model's vocabulary size {vocab}, got {bad[:5]}"
        )
    ids = prompt_ids(request.prompt, tokenizer, vocab)
    max_output = check_request(len(ids), params.max_tokens, limits, request.clip)
    return dataclasses.replace(request, ids=ids, max_output=max_output)


def prompt_ids(prompt: str | Sequence[int], tokenizer: Any, vocab: int) -> tuple[int, ...]:
    """The prompt's token ids: encoded text, or ids each an int in [0, vocab)."""
    if isinstance(prompt, str):
        ids = tuple(tokenizer.encode(prompt))
    else:
        ids = tuple(prompt)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"token ids must be ints in [0, {vocab}); got {bad[:5]}")
    if not ids:
        raise ConfigError("the prompt is empty")
    return ids


def check_request(
    prompt_len: int, max_tokens: int, limits: RequestLimits, clip: bool = True
) -> int:
    """The job's output bound (max_tokens clipped to the context); raise if it cannot run.

    A prompt must leave one token of context for output and, unless prefills are
    chunked, fit one iteration's token budget (its first prefill); prompt and output
    together must fit the device pool, since a running job's KV is wholly on the
    device. A job whose KV is later dropped re-prefills more than max_batch_tokens:
    the scheduler runs it alone.

    `clip` False refuses a max_tokens that does not fit the context after the prompt,
    naming the limit (a client's request, as vLLM's and OpenAI's APIs answer: a
    silently shorter reply reads as the model stopping); True cuts it to the context
    (offline `fsd.LLM`, scenarios, the simulator: "up to the context").
    """
    ctx = limits.max_model_len
    if prompt_len >= ctx:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens; the model's context is {ctx} "
            f"tokens{limits.context_note} and at least one must be left for output"
        )
    if not clip and prompt_len + max_tokens > ctx:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens and max_tokens is {max_tokens}: "
            f"{prompt_len + max_tokens} tokens, more than the model's context of {ctx} "
            f"tokens{limits.context_note}; ask for at most {ctx - prompt_len} output tokens"
        )
    if prompt_len > limits.max_batch_tokens and not limits.prefill_chunk:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens, more than max_batch_tokens "
            f"({limits.max_batch_tokens}) allows in one iteration"
        )
    max_output = min(max_tokens, ctx - prompt_len)
    need = limits.blocks_for(prompt_len + max_output)
    if need > limits.device_blocks:
        raise PromptTooLongError(
            f"prompt of {prompt_len} tokens plus {max_output} output tokens needs {need} KV "
            f"blocks; the device pool has {limits.device_blocks}"
        )
    return max_output


def strictest(limits: Sequence[RequestLimits]) -> RequestLimits:
    """Limits that every one of `limits` allows (replicas retuned apart): a request
    admitted under them runs on whichever replica takes it."""
    first = limits[0]
    return dataclasses.replace(
        first,
        max_batch_tokens=min(x.max_batch_tokens for x in limits),
        device_blocks=min(x.device_blocks for x in limits),
        prefill_chunk=min(x.prefill_chunk for x in limits),  # 0 if any prefills whole
    )


class Predicts(Protocol):
    """What the overload refusals read of a scheduler (fsd.sched.Scheduler)."""

    config: Any  # its SchedConfig: refuse_wait and refuse_late

    def __len__(self) -> int: ...
    def predicted_wait(self, job: Job, now: float) -> float | None: ...
    def predicted_latency(self, job: Job, now: float) -> float: ...


def refuse_late(sched: Predicts, job: Job, now: float, slo: float) -> None:
    """Overload refusal, off by default: raise OverloadedError for `job`, just queued
    in `sched` at `now`, when it is predicted to wait more than `refuse_wait` seconds
    for its first token (with a retry hint: the seconds it is over), or to see more
    than `refuse_late` SLOs (`slo` seconds) per output token. The engine and the
    simulator both call this, then take the job back."""
    bound, late = sched.config.refuse_wait, sched.config.refuse_late
    if bound is not None:  # (each prediction is made only when its bound is set)
        wait = sched.predicted_wait(job, now)
        if wait is not None and wait > bound:
            retry = float(math.ceil(wait - bound))
            raise OverloadedError(
                f"overloaded: {len(sched)} jobs queued, and this one is predicted to wait "
                f"{wait:.3g} s for its first token, more than refuse_wait = {bound:g} s; "
                f"retry after {retry:g} s",
                retry_after=retry,
            )
    if late is None:
        return
    per_token = sched.predicted_latency(job, now)
    if per_token > late * slo:
        raise OverloadedError(
            f"refused: {len(sched)} jobs queued, and this one is predicted to see "
            f"{per_token:.3g} s per output token, more than refuse_late = {late:g} x the "
            f"SLO of {slo:.3g} s; try again later"
        )

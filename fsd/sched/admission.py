"""Whether a request can ever run here: the one admission rule.

The engine (`Engine.add_request`), the simulator (`Simulator.check`) and the scenario
injector (`check_fits`) refuse the same requests with the same words: a job that
could never be scheduled would wait forever and hold its client.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsd.errors import PromptTooLongError

NO_CONTEXT_LIMIT = 1 << 62  # the simulator's model has no context length


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


def check_request(prompt_len: int, max_tokens: int, limits: RequestLimits) -> int:
    """The job's output bound (max_tokens clipped to the context); raise if it cannot run.

    A prompt must leave one token of context for output and, unless prefills are
    chunked, fit one iteration's token budget (its first prefill); prompt and output
    together must fit the device pool,
    since a running job's KV is wholly on the device. A job whose KV is later dropped
    re-prefills more than max_batch_tokens: the scheduler runs it alone.
    """
    ctx = limits.max_model_len
    if prompt_len >= ctx:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens; the model's context is {ctx} "
            f"tokens{limits.context_note} and at least one must be left for output"
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

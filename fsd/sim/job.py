"""A `Job` that knows only its token counts, for simulating large traces cheaply.

The scheduler and the block manager read token *counts* (`num_prompt_tokens`,
`num_tokens`, `num_new_tokens`, `num_output_tokens`), never the ids. A real `Job`
would hold 19k x 1k prompt ids for the Azure trace; `SimJob` keeps counts, and
stores a produced token by counting it (`Job.append_token` is the rule it shares
with the engine).

Time between tokens (TBT): a produced token after the first appends its gap to the
last one to the job's `gaps`, an `array('d')`: 8 bytes a gap and no float objects
(the Azure trace makes millions), and the gaps of chosen jobs stay readable (a
bench's running jobs during a burst); the metrics concatenate them all once.
"""

from __future__ import annotations

from array import array

from fsd.jobs import Job, SamplingParams

# Shared by every simulated job: the output bound lives in `max_output`.
_PARAMS = SamplingParams(max_tokens=1 << 30, ignore_eos=True)


class SimJob(Job):
    """A job of `prompt_len` prompt tokens that will generate exactly `output_len` tokens.

    `oracle_output_len` is set (srpt reads it); it holds no token ids.
    `num_tokens` is an attribute (the scheduler reads it for every queued job every
    iteration), not a property.
    """

    num_tokens: int = 0  # shadows Job's property: instance attribute, read hot

    def __init__(
        self,
        job_id: str,
        arrival: float,
        prompt_len: int,
        output_len: int,
        prefix_hashes: tuple[int, ...] = (),
        hash_block: int = 512,
    ) -> None:
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
        self.output_count = 0
        self.last_token_time = 0.0  # when it produced its last token
        self.gaps = array("d")  # seconds between consecutive tokens
        self.prefix_hashes = prefix_hashes  # a trace's chained prompt-block hashes
        self.hash_block = hash_block  # the prompt tokens each of them covers
        self.refused = False  # turned away on arrival (refuse_wait, refuse_late)

    def _store_token(self, token: int, now: float) -> None:
        if self.output_count:
            self.gaps.append(now - self.last_token_time)
        self.last_token_time = now
        self.num_tokens += 1
        self.output_count += 1

    def block_content(self, index: int, block_size: int) -> tuple[int, int] | None:
        """A full prompt block's name from the trace: the hash of the trace block that
        holds its last token (equal hashes: equal prompts up to that block's end) and
        its index. None past the hashes or the prompt (outputs are never shared)."""
        end = (index + 1) * block_size
        k = (end - 1) // self.hash_block
        if end > self.prompt_len or k >= len(self.prefix_hashes):
            return None
        return self.prefix_hashes[k], index

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_len

    @property
    def num_new_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.output_count

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
    def max_gap(self) -> float:
        """The longest time between two of its tokens (0 with fewer than two)."""
        return max(self.gaps, default=0.0)

    @property
    def ttft(self) -> float:
        assert self.first_token_time is not None, f"{self.job_id} produced no token"
        return self.first_token_time - self.arrival_time

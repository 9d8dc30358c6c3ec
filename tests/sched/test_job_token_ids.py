"""A job's token slice is the slice of its prompt and output joined, for any bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fsd.jobs import Job, SamplingParams


@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.lists(st.integers(0, 9), max_size=12),
       st.integers(0, 30), st.integers(0, 30))  # fmt: skip
def test_token_ids_is_the_joined_slice(prompt, output, start, end):
    job = Job(list(prompt), SamplingParams())
    job.output_token_ids.extend(output)
    assert job.token_ids(start, end) == (prompt + output)[start:end]

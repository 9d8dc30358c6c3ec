"""Fuzzed HTTP bodies against a real daemon: none answers 5xx, none stops it.

Hypothesis draws batches of requests (tests/server/http_fuzz.py says which kinds);
every answer must be a JSON 2xx or 4xx, and after every batch a plain completion
must still complete. Derandomized: every CI run sends the same bodies. The daemon's
context is 64 tokens, so a fuzzed body that asks for many tokens stays cheap;
bench/fuzz_http.py sends 2,000 the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.server.daemon_proc import daemon_fixture
from tests.server.http_fuzz import (
    DAEMON_CONFIG,
    MAX_BODY,
    cases,
    edge_cases,
    judge,
    normal_request,
    send,
)

BATCHES, BATCH = 25, 20  # 500 bodies

daemon = daemon_fixture(DAEMON_CONFIG, "http-fuzz", http=True)


def check_batch(daemon, batch) -> None:  # noqa: ANN001 - fixtures
    bad = []
    for case in batch:
        verdict = judge(send(daemon.http, case))
        if verdict is not None:
            bad.append(f"{case.path} {case.headers} {case.body[:200]!r}: {verdict}")
    assert daemon.proc.poll() is None, "the daemon died"
    assert not bad, "\n".join(bad)
    assert normal_request(daemon.http), "a plain completion failed after the batch"


@settings(
    max_examples=BATCHES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # a failure is reported as drawn, unshrunk
    suppress_health_check=list(HealthCheck),
)
@given(batch=st.lists(cases(), min_size=BATCH, max_size=BATCH))
def test_fuzzed_bodies_answer_4xx_or_2xx_and_the_daemon_serves_on(daemon, batch):
    check_batch(daemon, batch)


@pytest.mark.parametrize("case", edge_cases(MAX_BODY), ids=lambda c: c.name)
def test_edge_cases_answer_4xx_or_2xx(daemon, case):
    check_batch(daemon, [case])

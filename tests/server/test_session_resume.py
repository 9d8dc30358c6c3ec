"""A session that resumes gets every result of its jobs that finished while it was
away (fsd.server.loop.clients: a result is held whatever the session's live jobs, within
max_held_result_bytes, and the Welcome names what it could not keep)."""

from __future__ import annotations

import time

import zmq

from fsd import protocol as P
from tests.server.daemon_proc import pool_config, start_daemon

N = 200


def _submit_all(s: zmq.Socket) -> tuple[str, dict[str, list[int]]]:
    """Submit N jobs: the session's secret and the results that came before the last
    Accepted (a short job may finish while later ones are still being admitted)."""
    s.send(P.encode(P.Hello()))
    secret = _until(s, P.Welcome)[-1].session
    for i in range(N):
        sampling = P.Sampling(max_tokens=3 + i % 5, seed=i, temperature=1.0, ignore_eos=True)
        s.send(P.encode(P.Submit(req_id=f"r{i}", prompt_token_ids=[1 + i % 7, 2, 3], sampling=sampling)))
    got = _until(s, P.Accepted, count=N)
    assert sum(isinstance(m, P.Accepted) for m in got) == N
    return secret, {m.req_id: m.token_ids for m in got if isinstance(m, P.Finished)}


def _until(s: zmq.Socket, kind: type, count: int = 1, wait: float = 120.0) -> list[P.Reply]:
    got: list[P.Reply] = []
    deadline = time.time() + wait
    while sum(isinstance(m, kind) for m in got) < count and time.time() < deadline:
        if s.poll(200):
            got.append(P.decode_reply(s.recv()))
    return got


def _dealer(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _idle(d, wait: float = 120.0) -> None:
    with d.client(timeout=30.0) as c:
        deadline = time.time() + wait
        while c.status().jobs and time.time() < deadline:
            time.sleep(0.2)


def test_a_resumed_session_gets_all_its_results_with_the_reference_tokens(tmp_path):
    d = start_daemon(tmp_path, pool_config(256, 8, 0, client_timeout=120.0))
    try:
        ref = _dealer(d.endpoint)
        _, reference = _submit_all(ref)
        rest = _until(ref, P.Finished, count=N - len(reference))
        reference |= {m.req_id: m.token_ids for m in rest if isinstance(m, P.Finished)}
        assert len(reference) == N
        ref.close()

        away = _dealer(d.endpoint)
        secret, results = _submit_all(away)
        away.close()  # the results that did not come yet come while it is away
        _idle(d)
        back = _dealer(d.endpoint)
        back.send(P.encode(P.Hello(session=secret)))
        got = _until(back, P.Finished, count=N - len(results))
        welcome = got[0]
        assert isinstance(welcome, P.Welcome) and welcome.resumed and welcome.dropped == []
        assert len(welcome.jobs) == N - len(results) > 0
        held = {m.req_id: m.token_ids for m in got if isinstance(m, P.Finished)}
        assert held.keys().isdisjoint(results) and results | held == reference
        back.close()
    finally:
        assert d.stop() == 0


def test_past_the_result_budget_the_welcome_names_what_was_dropped(tmp_path):
    config = pool_config(256, 8, 0, client_timeout=120.0, max_held_result_bytes=20_000)
    d = start_daemon(tmp_path, config)
    try:
        away = _dealer(d.endpoint)
        secret, early = _submit_all(away)
        away.close()
        _idle(d)
        back = _dealer(d.endpoint)
        back.send(P.encode(P.Hello(session=secret)))
        got = _until(back, P.Welcome)
        welcome = got[0]
        assert isinstance(welcome, P.Welcome) and welcome.resumed
        held = [m for m in _until(back, P.Finished, count=len(welcome.jobs), wait=30) if isinstance(m, P.Finished)]
        assert welcome.dropped and len(early) + len(held) + len(welcome.dropped) == N
        assert {m.req_id for m in held}.isdisjoint([*welcome.dropped, *early])
        with d.client() as c:  # the daemon serves on
            assert len(c.complete([5, 6], max_tokens=3, ignore_eos=True).token_ids) == 3
        back.close()
    finally:
        assert d.stop() == 0

"""Who a caller is, against a real daemon and peers that pick their own routing ids:
the libzmq abort reproduction, a departed connection's id taken over, sessions
resumed and refused, and the connection cap."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import zmq
import zmq.auth

from fsd import protocol as P
from fsd.client import Client
from fsd.client.telemetry import decode_frame
from fsd.server.security import generate_keys
from tests.server.daemon_proc import curve_daemon, daemon_fixture, pool_config, start_daemon

CONFIG = pool_config(64, 8, 5, client_timeout=30)

daemon = daemon_fixture(CONFIG, "identity")
LIBZMQ_FIRST_ID = 0x6B8B4567  # glibc's first rand(): libzmq's first made-up routing id
LONG = 900  # tokens: a job outlives a few requests about it (the pool: 64 blocks of 16)


def dealer(endpoint: str, rid: bytes | None = None) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if rid is not None:
        s.setsockopt(zmq.ROUTING_ID, rid)
    s.connect(endpoint)
    return s


def collect(s: zmq.Socket, seconds: float, until: type | None = None) -> list[P.Reply]:
    got: list[P.Reply] = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        if s.poll(100):
            got.append(P.decode_reply(s.recv()))
            if until is not None and isinstance(got[-1], until):
                break
    return got


def test_peers_that_claim_libzmqs_next_ids_do_not_crash_the_daemon(daemon):
    squatters = [
        dealer(daemon.endpoint, b"\x00" + struct.pack(">I", LIBZMQ_FIRST_ID + k))
        for k in range(300)
    ]
    anonymous = [dealer(daemon.endpoint) for _ in range(5)]
    try:
        for s in squatters[:5] + anonymous:  # connected and heard, not only dialled
            s.send(P.encode(P.Status()))
        time.sleep(2.0)
        late = dealer(daemon.endpoint)  # an anonymous peer: the id libzmq would make up
        late.send(P.encode(P.Status()))
        assert isinstance(collect(late, 10, P.StatusReply)[-1], P.StatusReply)
        late.close()
        out = subprocess.run(
            [str(Path(sys.executable).parent / "fsctl"), "--endpoint", daemon.endpoint, "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert daemon.proc.poll() is None
        with daemon.client() as c:
            done = c.complete([5, 6, 7], max_tokens=24, ignore_eos=True)
        assert len(done.token_ids) == 24
    finally:
        for s in squatters + anonymous:
            s.close()


def test_a_departed_connections_id_brings_nothing_of_its_session(daemon):
    rid = b"victim-connection"
    victim = dealer(daemon.endpoint, rid)
    victim.send(P.encode(P.Hello()))
    [welcome] = collect(victim, 10, P.Welcome)
    assert isinstance(welcome, P.Welcome) and not welcome.resumed and welcome.session
    submit = P.Submit(
        req_id="v1",
        prompt_token_ids=[9, 8, 7],
        sampling=P.Sampling(max_tokens=LONG, ignore_eos=True),
        session=welcome.session,
    )
    victim.send(P.encode(submit))
    accepted = collect(victim, 20, P.Accepted)[-1]
    assert isinstance(accepted, P.Accepted)
    victim.close()  # gone; its job runs on for client_timeout
    time.sleep(0.5)

    thief = dealer(daemon.endpoint, rid)  # the same routing id, another peer
    for _ in range(10):
        thief.send(P.encode(P.Ping()))
        time.sleep(0.1)
    thief.send(P.encode(P.Abort(job_id=accepted.job_id)))
    got = collect(thief, 2)
    assert not [m for m in got if isinstance(m, P.Tokens | P.Finished | P.Welcome)]
    # "forbidden" while the job runs; "unknown-job" only if a fast machine finished it
    # first (never "aborted": its Finished below says "length")
    codes = [m.code for m in got if isinstance(m, P.Error)]
    assert codes in (["forbidden"], ["unknown-job"])
    thief.send(P.encode(P.Status(session="not-the-secret")))
    [refused] = collect(thief, 5, P.Error)
    assert refused.code == "bad-session"
    thief.send(P.encode(P.Hello(session="a-guess")))  # an unknown secret: a new session
    [fresh] = collect(thief, 5, P.Welcome)
    assert not fresh.resumed and fresh.jobs == [] and fresh.session != welcome.session
    thief.close()

    back = dealer(daemon.endpoint)  # the victim again, on a new connection
    back.send(P.encode(P.Hello(session=welcome.session)))
    got = collect(back, 120, P.Finished)
    resumed = got[0]
    assert isinstance(resumed, P.Welcome) and resumed.resumed and resumed.jobs == ["v1"]
    finished = got[-1]
    assert isinstance(finished, P.Finished) and finished.reason == "length"
    assert len(finished.token_ids) == LONG
    streamed = [t for m in got if isinstance(m, P.Tokens) for c in m.chunks for t in c.token_ids]
    assert streamed == finished.token_ids[len(finished.token_ids) - len(streamed) :]
    back.close()


def test_the_sdk_says_hello_and_sends_its_session(daemon):
    with Client(daemon.endpoint, timeout=10) as c:
        c.status()
        core = c._core  # noqa: SLF001 - what travels is the point here
        assert core.session is not None
        out = c.complete([1, 2], max_tokens=4, ignore_eos=True)
        assert len(out.token_ids) == 4


def test_past_max_connections_a_peer_is_told_so_and_the_rest_serve(tmp_path):
    d = start_daemon(tmp_path, CONFIG + "max_connections = 8\n")
    held = []
    try:
        for _ in range(8):
            s = dealer(d.endpoint)
            s.send(P.encode(P.Status()))
            assert isinstance(collect(s, 10, P.StatusReply)[-1], P.StatusReply)
            held.append(s)
        extra = dealer(d.endpoint)
        extra.send(P.encode(P.Status()))
        [error] = collect(extra, 10, P.Error)
        assert error.code == "too-many-connections" and "max_connections is 8" in error.message
        extra.close()
        for s in held[:2]:
            s.close()
        time.sleep(0.5)
        with Client(d.endpoint, timeout=10) as c:
            assert len(c.complete([3], max_tokens=3, ignore_eos=True).token_ids) == 3
        assert "max_connections is 8" in d.log.read_text()
    finally:
        for s in held:
            s.close()
        assert d.stop() == 0


def curve_dealer(endpoint: str, rid: bytes, keys: dict, who: str) -> zmq.Socket:
    server = zmq.auth.load_certificate(str(keys["server_public"]))[0]
    public, secret = zmq.auth.load_certificate(str(keys[f"{who}_secret"]))
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, rid)
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server, public, secret
    s.connect(endpoint)
    return s


def test_under_curve_a_client_key_on_an_operators_old_id_is_a_client(tmp_path):
    keys = generate_keys(tmp_path / "keys", clients=1, operators=1)
    d = curve_daemon(tmp_path, keys, "operator-1", operators=True)
    rid = b"operator-connection"
    try:
        op = curve_dealer(d.endpoint, rid, keys, "operator-1")
        op.send(
            P.encode(
                P.Submit(
                    req_id="o1",
                    prompt_token_ids=[1, 2],
                    sampling=P.Sampling(max_tokens=1500, ignore_eos=True),
                )
            )
        )
        accepted = collect(op, 20, P.Accepted)[-1]
        op.send(P.encode(P.Status()))
        assert collect(op, 10, P.StatusReply)[-1].role == "operator"
        op.close()
        time.sleep(0.5)
        intruder = curve_dealer(d.endpoint, rid, keys, "client-1")
        intruder.send(P.encode(P.Status()))
        got = collect(intruder, 10, P.StatusReply)
        # its role is its own key's; (the operator's tokens may still reach a peer that
        # claims the operator's exact routing id: under CURVE the id is the peer's
        # choice, and the SDK picks 96 random bits so that nobody can name it)
        assert got[-1].role == "client"
        intruder.send(P.encode(P.Abort(job_id=accepted.job_id)))
        assert [m.code for m in collect(intruder, 5, P.Error)] == ["forbidden"]
        intruder.send(P.encode(P.Retune(changes={"policy": "fcfs"})))
        assert [m.code for m in collect(intruder, 5, P.Error)] == ["forbidden"]
        intruder.close()
    finally:
        assert d.stop() == 0


def _words(obj: object) -> tuple[set[str], list[list[int]]]:
    """Every string and every list of ints inside a decoded message."""
    strings: set[str] = set()
    lists: list[list[int]] = []
    stack = [msgspec.to_builtins(obj)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings.add(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            if item and all(isinstance(x, int) for x in item):
                lists.append(item)
            stack.extend(item)
    return strings, lists


def test_what_others_learn_of_a_job_is_its_shape_never_its_text_name_or_session(daemon):
    # a subscriber (anyone who reaches the telemetry port) and another client's
    # ListJobs / GetJob see job ids, lengths and levels: no prompt, no output, no req_id,
    # no session secret
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(daemon.telemetry)
    frames: list[list[bytes]] = []
    owner = dealer(daemon.endpoint)
    nosy = dealer(daemon.endpoint)
    try:
        time.sleep(0.5)  # the subscription reaches the publisher
        owner.send(P.encode(P.Hello()))
        [welcome] = collect(owner, 10, P.Welcome)
        secret_prompt = "the vault code is swordfish"
        submit = P.Submit(
            req_id="private-request-name",
            prompt=secret_prompt,
            sampling=P.Sampling(max_tokens=LONG, ignore_eos=True),
            session=welcome.session,
        )
        owner.send(P.encode(submit))
        accepted = collect(owner, 20, P.Accepted)[-1]
        assert isinstance(accepted, P.Accepted)
        nosy.send(P.encode(P.ListJobs()))
        nosy.send(P.encode(P.GetJob(job_id=accepted.job_id)))
        seen = collect(nosy, 5)
        owned = collect(owner, 120, P.Finished)
        finished = owned[-1]
        assert isinstance(finished, P.Finished) and len(finished.token_ids) == LONG
        time.sleep(0.5)  # the last snapshot and the finish event
        while sub.poll(100):
            frames.append(sub.recv_multipart())
    finally:
        for s in (owner, nosy, sub):
            s.close()
    views = [m for m in seen if isinstance(m, P.JobList | P.JobReply)]
    assert len(views) == 2
    listed = [j.job_id for v in views for j in (v.jobs if isinstance(v, P.JobList) else [v.job])]
    assert listed.count(accepted.job_id) == 2  # it saw the job, as a shape
    assert frames, "no telemetry arrived"
    private = [secret_prompt.encode(), b"swordfish", b"private-request-name"]
    private.append(welcome.session.encode())
    raw = [b"".join(f) for f in frames] + [P.encode(v) for v in views]
    for blob in raw:
        assert not [p for p in private if p in blob]
    decoded = [decode_frame(*f) for f in frames] + views
    outputs = finished.token_ids
    for message in decoded:
        strings, lists = _words(message)
        assert not strings & {secret_prompt, "private-request-name", welcome.session}
        # no run of 8 output tokens (the text a subscriber could decode) in any list
        runs = {tuple(outputs[i : i + 8]) for i in range(len(outputs) - 7)}
        for ints in lists:
            assert not {tuple(ints[i : i + 8]) for i in range(len(ints) - 7)} & runs

"""A ListJobs flood: one `JobList` per engine state, encoded once for every asker."""

from __future__ import annotations

from types import SimpleNamespace

from fsd import protocol as P
from fsd.server.loop import frontend as frontend_mod
from fsd.server.loop.control import ControlHandler


class _Router:
    """Stands in for the zmq.ROUTER socket: keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_multipart(self, parts: list[bytes], flags: int = 0) -> None:
        self.sent.append(parts[1])


def test_a_job_list_is_built_and_encoded_once_per_state(monkeypatch):
    rows = [P.JobInfo(
        job_id="j", state="waiting", level=1, kv="none", blocks=0, host_blocks=0, enst=None,
        prompt_tokens=4, output_tokens=0, waited=0.0, attained=0.0, arrival=1.0,
    )]  # fmt: skip
    state = {"rows": rows}
    encodes: list[type] = []
    real = P.encode
    monkeypatch.setattr(P, "encode", lambda msg: encodes.append(type(msg)) or real(msg))
    router = _Router()
    front = frontend_mod.Frontend.__new__(frontend_mod.Frontend)  # only the sending half
    front.router, front.turn_bytes, front._shared = router, 0, None
    control = ControlHandler.__new__(ControlHandler)
    control.face = SimpleNamespace(jobs=lambda now=None: state["rows"])
    control._listed = None
    control.send = lambda ident, msg: front._to_route(b"route", msg)
    caller = SimpleNamespace(ident=b"s")
    for _ in range(5):
        control.on_listjobs(caller, P.ListJobs())  # type: ignore[arg-type]
    state["rows"] = [*rows, rows[0]]  # the engine moved on
    control.on_listjobs(caller, P.ListJobs())  # type: ignore[arg-type]
    front._to_route(b"route", P.Ack(what="ping"))  # other replies are encoded as ever
    front._to_route(b"route", control._listed)
    assert encodes == [P.JobList, P.JobList, P.Ack]
    assert router.sent[:5] == [router.sent[0]] * 5 and router.sent[5] != router.sent[0]
    assert len(P.decode_reply(router.sent[5]).jobs) == 2
    assert router.sent[-1] == router.sent[5]

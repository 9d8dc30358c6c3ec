"""The SDK never calls a finished job lost: on a resumed Welcome a stream is held on
(its result follows), failed with "result-dropped" when the daemon could not keep its
result, and "lost" only when the daemon no longer knows it."""

from __future__ import annotations

from fsd import protocol as P
from fsd.client.core import ClientCore, _Stream
from fsd.client.errors import RequestError


class Sink(list):
    def put_nowait(self, item: object) -> None:
        self.append(item)


def test_a_resumed_welcome_holds_finished_jobs_and_names_dropped_ones():
    core = ClientCore("ipc:///nowhere", timeout=10.0, heartbeat=3.0)
    sinks = {r: Sink() for r in ("held", "dropped", "gone")}
    for req_id, sink in sinks.items():
        core.streams[req_id] = _Stream(sink, None, job_id=f"job-{req_id}", resuming=True)
    welcome = P.Welcome(session="s", resumed=True, jobs=["held"], dropped=["dropped"])
    core.on_frame(P.encode(welcome), 0.0)
    assert not sinks["held"] and "held" in core.streams  # its Finished comes next
    [dropped] = sinks["dropped"]
    assert isinstance(dropped, RequestError) and dropped.code == "result-dropped"
    assert "max_held_result_bytes" in str(dropped)
    [gone] = sinks["gone"]
    assert isinstance(gone, RequestError) and gone.code == "lost"

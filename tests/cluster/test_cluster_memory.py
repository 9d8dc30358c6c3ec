"""N replicas behind one face keep nothing per finished job (issue P20): the placement
table empties as jobs end, and the replicas' events, which only the daemon drains (the
offline API never does), are the latest few at most."""

from __future__ import annotations

import time

from fsd.admission import JobRequest
from fsd.cluster import face as cluster_face
from fsd.cluster.start import start_replicas
from fsd.config import EngineConfig
from fsd.jobs import SamplingParams

CONFIG = dict(model="tiny", device="cpu", num_gpu_blocks=64, profile="opt-13b-a100", threads=1)


def test_undrained_events_and_the_placement_table_stay_bounded(monkeypatch) -> None:
    monkeypatch.setattr(cluster_face, "MAX_EVENTS", 30)
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2, in_process=True)
    try:
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        ids = {face.admit(JobRequest([5 + i, 6, 7], params)).job_id for i in range(40)}
        done: set[str] = set()
        deadline = time.monotonic() + 120.0
        while done != ids:  # the offline API's loop: step, never drain the events
            assert time.monotonic() < deadline, f"unfinished: {ids - done}"
            done |= {d.job_id for d in face.step().deltas if d.finished}
        assert len(face._events) == 30  # 40 jobs made 120 events or more: the latest 30
        assert not face.jobs_at.owner and not face.jobs_at.pending and face.live() == 0
        assert len(face.decisions) <= cluster_face.ROUTES_KEPT
    finally:
        face.close()

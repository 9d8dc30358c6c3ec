"""A daemon of two replicas behind one endpoint (`fsd start --replicas 2`, Ray actors on
CPU): clients see one daemon; status, telemetry and fsctl see the replicas."""

from __future__ import annotations

import pytest

from fsd.jobs import SamplingParams
from tests.server.daemon_proc import pool_config, start_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):  # noqa: ANN201
    config = pool_config(64, 4, 20) + "[cluster]\nreplicas = 2\n"
    d = start_daemon(tmp_path_factory.mktemp("replicas"), config, wait=240.0)
    yield d
    d.stop()


def test_two_replicas_serve_as_one_daemon(daemon):
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0)
    with daemon.client() as c:
        st = c.status()
        assert st.replicas == 2 and st.degraded is None
        outs = [h.result(timeout=120) for h in [c.submit(f"prompt {i}", params=params) for i in range(8)]]
        assert all(len(o.token_ids) == 12 for o in outs)
        same = [c.submit("prompt 3", params=params).result(timeout=120) for _ in range(2)]
        assert same[0].token_ids == same[1].token_ids == outs[3].token_ids  # on either replica
    snap = daemon.snapshot()
    assert snap.replicas is not None and [r.index for r in snap.replicas] == [0, 1]
    assert snap.routes and {r.replica for r in snap.routes} <= {0, 1}


def test_fsctl_drains_and_retunes_one_replica(daemon):
    with daemon.client() as c:
        detail = c.drain(replica=1)
        assert detail["replica"] == 1
        assert {r.index: r.health for r in daemon.snapshot().replicas}[1] == "draining"
        job = c.submit("after the drain", max_tokens=4).result(timeout=120)
        assert len(job.token_ids) == 4
        c.undrain(replica=1)
        config = c.retune(replica=0, policy="fcfs")
        assert config["sched"]["policy"] == "fcfs"
        with pytest.raises(Exception, match="no replica 7"):
            c.retune(replica=7, policy="fcfs")
        c.retune(policy="default")

"""A bounded share of the identity fuzzer (bench/fuzz_zmq.py runs 10,000 operations
over 500 sockets): chosen, reused and colliding routing ids, hoarded slots and
subscription floods beside honest clients, on a table of 96 connections."""

from __future__ import annotations

from tests.server.daemon_proc import daemon_fixture
from tests.server.fuzz_identity import IdentityFuzzer
from tests.server.test_identity import CONFIG

daemon = daemon_fixture(CONFIG + "max_connections = 96\n", "identity-fuzz")


def test_chosen_and_colliding_ids_leak_nothing_and_crash_nothing(daemon):
    fuzzer = IdentityFuzzer(
        daemon.endpoint, sockets=100, seed=1, token=daemon.token, telemetry=daemon.telemetry
    )
    stats = fuzzer.run(1500)
    assert stats.connects > 100 and stats.replies > 0
    assert stats.by_op["hoard"] and stats.by_op["subscribe"] and stats.by_op["subscribe-telemetry"]
    assert stats.leaks == []
    assert stats.honest_jobs > 0 and stats.honest_bad == []
    assert daemon.proc.poll() is None
    with daemon.client() as c:
        assert len(c.complete([4, 5], max_tokens=5, ignore_eos=True).token_ids) == 5

"""Each router policy's choice on hand-built replica states (fsd.router.policies)."""

from __future__ import annotations

import pytest

from tests.router.helpers import BS, COST, DEVICE, HOST, cached, names, request, router, state

PREFIX = names(*[("sys", i) for i in range(4)])  # a 4-block (64-token) shared prefix


def test_fsd_looks_at_the_work_ahead_of_the_level_a_request_enters():
    """Replica 0 has 2 jobs, all at the top level; replica 1 has 20, and twice the work,
    all at the bottom. A short request enters the top level: nothing runs ahead of it
    on replica 1."""
    r = router("fsd")
    top = (0.5,) * 8  # 0.5 s ahead at every level
    bottom = (0.0,) * 7 + (1.0,)  # only a job entering the last level waits
    r.update(state(0, ahead=top, waiting=2, work=(0.5,) + (0.0,) * 7))
    r.update(state(1, ahead=bottom, waiting=20, work=(0.0,) * 7 + (1.0,)))
    d = r.choose(request(0, prompt=64))
    assert d.replica == 1 and "level 0" in d.reason
    ll = router("least-loaded")
    ll.update(state(0, waiting=2))
    ll.update(state(1, waiting=20))
    assert ll.choose(request(0)).replica == 0  # vLLM's score sees only the counts


def test_fsd_prices_a_cached_prefix_by_its_tier():
    prompt = 64 + 8  # the 4 shared blocks and half a block of its own
    r = router("fsd", replicas=3)
    r.update(state(0, events=cached(PREFIX, HOST)))
    r.update(state(1))  # nothing cached
    r.update(state(2, events=cached(PREFIX, DEVICE)))
    d = r.choose(request(0, prompt, PREFIX))
    assert d.replica == 2 and "4 dev + 0 host" in d.reason
    # without the device copy, the host copy (16 us a block here) still beats recomputing
    r = router("fsd", replicas=2)
    r.update(state(0))
    r.update(state(1, events=cached(PREFIX, HOST)))
    d = r.choose(request(0, prompt, PREFIX))
    assert d.replica == 1 and "0 dev + 4 host" in d.reason


def test_fsd_avoids_a_replica_whose_kv_cannot_hold_the_prompt():
    """Replica 0 has nothing ahead of the request but 3 blocks too few: it waits for 3 %
    of its 5 s of queued work to drain; replica 1 has 50 ms ahead and room."""
    r = router("fsd")
    work = (5.0,) + (0.0,) * 7
    r.update(state(0, device_free=2, device_total=100, work=work))  # 64 tokens: 5 blocks
    r.update(state(1, ahead_all=0.05, work=work))
    d = r.choose(request(0, prompt=64))
    assert d.replica == 1
    assert "room" in router_reason(work)
    r = router("fsd")
    r.update(state(0, device_free=2))
    r.update(state(1, device_free=10))
    assert r.choose(request(0, prompt=64)).replica == 1


def router_reason(work: tuple[float, ...]) -> str:
    r = router("fsd", replicas=1)
    r.update(state(0, device_free=2, device_total=100, work=work))
    return r.choose(request(0, prompt=64)).reason


def test_fsd_falls_back_to_least_work_when_imbalanced():
    """Replica 0 holds the prefix but 100 s of queued work, 50 x replica 1's."""
    r = router("fsd", imbalance_s=10.0, imbalance_ratio=2.0)
    r.update(state(0, events=cached(PREFIX), work=(100.0,) + (0.0,) * 7))
    r.update(state(1, work=(2.0,) + (0.0,) * 7))
    d = r.choose(request(0, 72, PREFIX))
    assert d.replica == 1 and d.reason.startswith("imbalanced")
    # balanced, the prefix wins (its prefill saved beats 20 ms more work there)
    r = router("fsd", imbalance_s=10.0, imbalance_ratio=2.0)
    r.update(state(0, events=cached(PREFIX), work=(2.02,) + (0.0,) * 7))
    r.update(state(1, work=(2.0,) + (0.0,) * 7))
    assert r.choose(request(0, 72, PREFIX)).replica == 0


def test_a_session_stays_while_its_replica_costs_at_most_the_affinity_bound():
    r = router("fsd", affinity_s=0.5)
    r.update(state(0))
    r.update(state(1, ahead_all=0.2))
    assert r.choose(request(0, session="s")).replica == 0
    r.update(state(0, seq=2, ahead_all=0.4))  # now 0.4 s worse than replica 1... within 0.5
    r.update(state(1, seq=2))
    d = r.choose(request(1, session="s"))
    assert d.replica == 0 and d.reason.startswith("session stays")
    assert r.choose(request(2, session="t")).replica == 1  # another session: the best
    r.update(state(0, seq=3, ahead_all=0.9))  # 0.9 s worse: past the bound
    r.update(state(1, seq=3))
    assert r.choose(request(3, session="s")).replica == 1
    off = router("fsd", affinity_s=0.0)
    off.update(state(0))
    off.update(state(1, ahead_all=0.2))
    off.choose(request(0, session="s"))
    off.update(state(0, seq=2, ahead_all=0.4))
    off.update(state(1, seq=2))
    assert off.choose(request(1, session="s")).replica == 1


@pytest.mark.parametrize("name", ["fsd", "least-loaded", "power-of-two", "cache-aware"])
def test_requests_routed_count_until_a_state_acknowledges_them(name):
    """Two idle replicas, no push between: the second request goes to the other one;
    once a push counts the first (admitted), the router's guess gives way to it."""
    r = router(name)
    r.update(state(0))
    r.update(state(1))
    first = r.choose(request(0)).replica
    assert r.views[first].waiting == 1
    assert r.choose(request(1)).replica == 1 - first
    # replica `first` says it took one request (admitted) and is idle again
    r.update(state(first, seq=2, admitted=1))
    assert r.views[first].waiting == 0 and not r.views[first].pending


def test_fsd_counts_the_work_of_requests_routed_since_the_last_push():
    r = router("fsd")
    r.update(state(0))
    r.update(state(1, ahead_all=0.02))  # 20 ms ahead of anything entering
    assert r.choose(request(0, prompt=512)).replica == 0
    assert r.views[0].ahead(7) > 0.02  # the first one's prefill and decode, ahead of later jobs
    assert r.choose(request(1, prompt=512)).replica == 1


def test_round_robin_takes_turns_and_power_of_two_the_less_loaded_of_two():
    r = router("round-robin", replicas=3)
    assert [r.choose(request(i)).replica for i in range(6)] == [0, 1, 2, 0, 1, 2]
    p = router("power-of-two", replicas=2)
    p.update(state(0, waiting=5))
    p.update(state(1, waiting=0, running=3))
    assert p.choose(request(0)).replica == 1  # 3 < 20: both are always drawn with 2


def test_cache_aware_follows_the_longest_prefix_unless_imbalanced():
    r = router("cache-aware", replicas=3)
    r.update(state(0, events=cached(PREFIX[:2])))
    r.update(state(1, events=cached(PREFIX)))
    r.update(state(2))
    d = r.choose(request(0, 72, PREFIX))
    assert d.replica == 1 and d.reason.startswith("longest prefix")
    # a short match (under 30% of the prompt): the replica caching least
    long_prompt = 64 * 10
    assert r.choose(request(1, long_prompt, PREFIX)).replica == 2
    # imbalanced (100 vs 10 jobs): the shortest queue, whatever it caches
    r = router("cache-aware", replicas=2)
    r.update(state(0, events=cached(PREFIX), waiting=100))
    r.update(state(1, waiting=10))
    d = r.choose(request(0, 72, PREFIX))
    assert d.replica == 1 and d.reason.startswith("imbalanced")


def test_the_router_times_and_keeps_its_decisions():
    r = router("fsd")
    for i in range(300):
        r.choose(request(i))
    recent = r.recent()
    assert len(recent) == 256 and recent[-1].request_id == "q299"
    timing = r.timing()
    # the mean is of every decision, the P99 of the latest: no order between them (one
    # slow decision on a loaded machine puts the mean past the P99)
    times = sorted(r._times)
    assert timing["decisions"] == 300 and timing["mean_s"] > 0
    assert times[len(times) // 2] <= timing["p99_s"] <= times[-1]
    assert all(d.reason for d in recent)


def test_the_cost_model_and_block_size_are_the_routers():
    assert COST.swap_time(BS) < COST.prefill_time(BS)  # the tests above rely on it

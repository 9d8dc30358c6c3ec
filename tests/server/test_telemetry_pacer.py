"""The job table's pacing: its share of the engine thread stays under the budget."""

from fsd.server.publish.telemetry import JobTablePacer


def test_a_cheap_table_goes_out_in_every_snapshot():
    pacer = JobTablePacer(budget=0.02)
    sent = 0
    for i in range(10):
        now = i * 0.1
        if pacer.due(now):
            pacer.sent(now, cost=0.0005)  # 0.5 ms: 0.5% of a 100 ms period
            sent += 1
    assert sent == 10


def test_an_expensive_table_is_spaced_so_its_share_stays_under_the_budget():
    pacer = JobTablePacer(budget=0.02)
    cost = 0.04  # 40 ms, as 10k jobs cost
    times = []
    for i in range(100):  # 10 s of 10 Hz snapshots
        now = i * 0.1
        if pacer.due(now):
            pacer.sent(now, cost)
            times.append(now)
    assert times[0] == 0.0
    assert len(times) * cost / 10.0 <= 0.02 + cost / 10.0
    assert all(b - a >= cost / 0.02 - 1e-9 for a, b in zip(times, times[1:], strict=False))

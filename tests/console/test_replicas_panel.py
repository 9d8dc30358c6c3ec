"""A daemon of several replicas: `fsctl top` shows a replicas panel (each replica's
load, pools, prefix hits and health, the router's latest decisions); a one-replica
daemon's console is as before (no panel)."""

from __future__ import annotations

import asyncio

import msgspec

from fsd import protocol as P
from fsd.console.top.app import TopApp
from fsd.console.top.data import fold
from fsd.console.top.render_replicas import replicas_panel
from tests.wire_samples import PREFIX, kv_info

REPLICAS = [
    P.ReplicaInfo(
        index=0, live=12, running=8, levels=[3, 5, 4],
        kv=kv_info(device_used=61, device_total=100, host_used=4, host_total=100),
        prefix=msgspec.structs.replace(PREFIX, queries=100, hits=37),
    ),
    P.ReplicaInfo(index=1, health="worker lost: node 2", live=0, levels=[0, 0]),
]  # fmt: skip
ROUTES = [P.RouteInfo(time=1.0, job_id="job-r9", replica=0, why="least expected wait (0.4 s)")]


def with_replicas(recording: list) -> list:
    return [
        msgspec.structs.replace(m, replicas=REPLICAS, routes=ROUTES)
        if isinstance(m, P.Snapshot) else m
        for m in recording
    ]  # fmt: skip


def test_each_replica_is_one_line_and_the_routers_decisions_follow(recording):
    text = replicas_panel(fold(with_replicas(recording)).view()).renderables  # type: ignore[union-attr]
    lines = [str(t) for t in text]
    assert lines[0] == "r0 ok  live 12 run 8  Q 3/5/4  dev  61% host   4%  hit 37%"
    assert lines[1] == "r1 DOWN  live 0 run 0  Q 0/0\n   worker lost: node 2"
    assert lines[2] == "job-r9 → r0: least expected wait (0.4 s)"


def test_the_panel_shows_only_for_a_daemon_of_several_replicas(recording):
    async def shown(messages: list) -> bool:
        app = TopApp(None, None, state=fold(messages))
        async with app.run_test(size=(200, 48)) as pilot:
            await pilot.pause()
            return bool(app.query_one("#replicas").display)

    assert asyncio.run(shown(with_replicas(recording)))
    assert not asyncio.run(shown(recording))

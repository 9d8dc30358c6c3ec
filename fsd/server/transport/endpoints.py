"""The daemon's public endpoints behind gates, and the budgets they keep.

Requests: the ROUTER binds a private `ipc://` path behind a `Gate` that admits DEALER
and REQ peers, counts inbound bytes in the `InboundLedger` and bounds each connection's
unsent replies (`max_client_backlog_bytes`, all of them `max_backlog_bytes`).
Telemetry: the PUB binds another private path behind a gate that admits SUB and XSUB
peers, passes only subscriptions to the telemetry's topics (`fsd.server.transport.subscriptions`)
and bounds each subscriber's unsent messages (`max_subscriber_backlog_bytes`): a
subscriber that does not read is dropped, and the PUB never queues for it. Both gates
keep a connection table (`fsd.server.transport.slots`: `max_connections`, a share per peer, the
operator's reserve). An
`inproc://` endpoint has no gate (in-process peers only). Under CURVE the handshake
passes through the gates unchanged, so the sockets' own CURVE setup still applies.

Counters: `budget_figures` gives /metrics what the gates refused and dropped
(`fsd.server.publish.prom_process.BudgetCounters`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.server.transport import zmtp
from fsd.server.transport.gate import Gate
from fsd.server.transport.ledger import SMALL_FRAME, InboundLedger, cost
from fsd.server.transport.relay import Limits

# the ROUTER's queues in messages, per connection: bytes are bounded by the gate, so
# these only cap the count of small messages (a client pipelining 10,000 submits
# waits on TCP, not on the daemon); replies are read by the gate as they come, so
# the send queue only has to hold one turn's answers to one client
ROUTER_RCVHWM = 1000
ROUTER_SNDHWM = 100_000  # as before the gate: a full queue drops replies silently
PUB_SNDHWM = 1000  # the telemetry gate reads each subscriber's queue as it fills
PUB_MAXMSGSIZE = 64 * 1024  # subscriptions are topic names: bigger frames drop the peer


def tune_router(router: zmq.Socket) -> None:
    router.setsockopt(zmq.SNDHWM, ROUTER_SNDHWM)
    router.setsockopt(zmq.RCVHWM, ROUTER_RCVHWM)


def inbound_ledger(cfg: ServerConfig) -> InboundLedger:
    """The requests' inbound budget: `max_inbound_bytes` in all, a quarter of it (or
    room for the largest frame and a small one) per connection."""
    total = cfg.max_inbound_bytes
    per_connection = max(total // 4, cost(cfg.max_frame_bytes) + cost(SMALL_FRAME))
    return InboundLedger(total, per_connection=per_connection)


def request_gate(
    cfg: ServerConfig, curve: bool, on_close: Callable[[bytes, str | None], None], slack: int
) -> Gate:
    """The requests' gate (not started), with its inbound budget (`limits.ledger`);
    `slack`: what libzmq accepts past max_frame_bytes."""
    limits = Limits(
        curve,
        zmtp.REQUEST_PEERS,
        cfg.max_client_backlog_bytes,
        inbound_ledger(cfg),
        max_frame=cfg.max_frame_bytes,
        max_curve_frame=cfg.max_frame_bytes + slack,
    )
    return _gate(cfg, cfg.endpoint, limits, on_close=on_close)


def telemetry_gate(cfg: ServerConfig, curve: bool) -> Gate:
    """The telemetry PUB's gate (not started)."""
    limits = Limits(
        curve,
        zmtp.TELEMETRY_PEERS,
        cfg.max_subscriber_backlog_bytes,
        topics=frozenset({P.TOPIC_SNAPSHOT, P.TOPIC_EVENT}),
    )
    return _gate(cfg, cfg.telemetry_endpoint, limits, name="telemetry")


def _gate(cfg: ServerConfig, endpoint: str, limits: Limits, **more: Any) -> Gate:
    """A gate with the daemon's connection table: its size, a peer's share, backlogs."""
    return Gate(
        endpoint,
        limits=limits,
        max_connections=cfg.max_connections,
        max_per_peer=cfg.max_connections_per_peer,
        max_backlog=cfg.max_backlog_bytes,
        **more,
    )


def tune_pub(pub: zmq.Socket) -> None:
    pub.setsockopt(zmq.SNDHWM, PUB_SNDHWM)
    pub.setsockopt(zmq.MAXMSGSIZE, PUB_MAXMSGSIZE)


def budget_figures(
    ledger: InboundLedger | None, requests: Gate | None, telemetry: Gate | None
) -> dict[str, float]:
    """The budgets' counters and levels now, by metric name."""
    out = ledger.figures() if ledger is not None else {}
    for name, gate in (("requests", requests), ("telemetry", telemetry)):
        if gate is not None:
            figures = gate.figures()
            out[f"fsd_gate_dropped_connections:{name}"] = figures["dropped"]
            out[f"fsd_gate_backlog_bytes:{name}"] = figures["backlog"]
            out[f"fsd_gate_refused_connections:{name}"] = figures["refused"]
            out[f"fsd_gate_reclaimed_connections:{name}"] = figures["reclaimed"]
    return out

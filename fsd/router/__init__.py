"""Routing (pure Python, no torch): which replica of the engine serves each request.

Owns: the choice of replica. A replica pushes a compact `ReplicaState` after each
iteration (`state`: queued work per level from its scheduler, `work`; KV room per
tier; its prefix cache's block events since the last push, fsd.kv.prefix_events; a sequence
number, a gap forcing a resync); the router keeps a view of each replica (`view`:
the last state, the requests routed since, counted optimistically) with an index of
its cached blocks by tier (`index`), and a policy (`policies`, named in `registry`)
picks the replica: `fsd` by estimated TTFT (`estimate`), or a baseline (round-robin,
least-loaded, power-of-two, cache-aware). `router` ties them together and records
each decision with its reason and its time.

The daemon's side (one process per replica, Ray) calls, per replica,
`StateBuilder(replica, blocks).build(scheduler, now, admitted)` after each iteration
and hands the state to `Router.update`, which returns True when that replica must
`StateBuilder.resync()`; per request, `Router.choose(RouteRequest(id, prompt_len,
prompt_names(token_ids, block_size), session))`. The simulator (fsd.sim.replicas)
does the same with simulated replicas.

May import: fsd.sched, fsd.kv, fsd.cost, fsd.jobs, fsd.config, fsd.errors. Never torch,
nor fsd.engine, fsd.server, fsd.console or fsd.sim: the same code routes in the
daemon and in the simulator, and is unit-tested in milliseconds.
"""

from __future__ import annotations

from fsd.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("DEFAULT_ROUTER", "ROUTERS", "check_router", "make_router"), "fsd.router.registry"),
    **dict.fromkeys(("Decision", "Router", "prompt_names"), "fsd.router.router"),
    "RouteRequest": "fsd.router.request",
    **dict.fromkeys(("ReplicaState", "StateBuilder"), "fsd.router.state"),
}  # fmt: skip
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)

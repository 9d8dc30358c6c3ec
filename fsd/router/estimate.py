"""A new request's time to first token on one replica, as the `fsd` router estimates it.

    TTFT = wait + prefill + room

- prefill: the prompt left after the replica's cached prefix (fsd.router.index),
  chunked over the cached tokens; a run found only on the host comes back by copy
  (`CostModel.swap_time`) when that beats recomputing it, the replica's own rule
  (fsd.kv.prefix_types.CopyBeatsRecompute), else it is recomputed.
- wait: the service queued ahead of the level the request would enter there
  (skip-join: the level whose quantum covers that prefill; fsd.router.work), spread
  over the replica's batch, the pending requests counted (fsd.router.view).
- room: when the replica's free device blocks cannot hold the request, the room must
  be made: the shortfall goes to host memory and back (or, with no host room either,
  is recomputed), and meanwhile the request waits for that share of the replica's KV
  to drain (shortfall / device blocks x its queued work over its batch): both times
  `ROOM_WEIGHT`.

All of it in profile seconds, scaled by the replica's live cost (measured / profiled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsd.router.view import Pending, ReplicaView
from fsd.router.work import DEFAULT_TOKENS
from fsd.sched.levels import entry_level

if TYPE_CHECKING:
    from fsd.cost import CostModel
    from fsd.router.request import RouteRequest

# the weight of the KV-room term (tuned on bench/replicas.py's tuning set)
ROOM_WEIGHT = 1.0


@dataclass(frozen=True)
class Estimate:
    """One replica's estimate for one request (seconds, but `level` and the blocks)."""

    ttft: float
    wait: float
    prefill: float
    room: float
    level: int
    device_hit: int  # leading blocks cached on the device (or pending there)
    host_hit: int  # and after them, copied back from the host
    blocks: int  # device blocks the request will take
    expected: float  # its expected decode service there, profile seconds (inf: unknown)
    prefill_profile: float  # its prefill, profile seconds (what `Pending` records)


def estimate(view: ReplicaView, request: RouteRequest, cost: CostModel) -> Estimate:
    """The request's estimated TTFT on the replica `view` shows (module doc)."""
    st = view.state
    bs, prompt = st.block_size, request.prompt_len
    found, host = view.match(request.names)
    device = found - host
    if host and not cost.swap_time(host * bs) < cost.chunk_time(host * bs, device * bs):
        found, host = device, 0  # recomputing the host run is cheaper: the replica will
    hit = min(found * bs, max(prompt - 1, 0))
    new = prompt - hit
    prefill = cost.chunk_time(new, hit) if hit else cost.prefill_time(new)
    copy = cost.swap_time(host * bs) if host else 0.0
    level = entry_level(st.quanta, cost.job_iteration_time(new, prompt))
    wait = view.ahead(level) / max(st.batch_size, 1)
    blocks = max(-(-(prompt + 1) // bs) - device, 0)
    short = blocks - view.device_free
    room = 0.0
    if short > 0:
        tokens = short * bs
        move = 2 * cost.swap_time(tokens) if st.host_free >= short else cost.prefill_time(tokens)
        drain = short / max(st.device_total, 1) * view.work() / max(st.batch_size, 1)
        room = ROOM_WEIGHT * (move + drain)
    scale = st.scale
    step, per_ctx = cost.decode_line()
    flat = len(st.quanta) == 1 and st.quanta[0] == math.inf
    tokens_out = st.mean_output or (DEFAULT_TOKENS if flat else math.inf)
    expected = tokens_out * (step + per_ctx * prompt)
    return Estimate(
        (wait + prefill + copy + room) * scale, wait * scale, (prefill + copy) * scale,
        room * scale, level, device, host, blocks, expected, prefill + copy,
    )  # fmt: skip


def pending_of(
    view: ReplicaView, request: RouteRequest, est: Estimate | None, names: bool
) -> Pending:
    """What routing `request` to `view`'s replica adds there until a state counts it
    (without an estimate, a baseline's: a job and its prompt, no work; `names`: its
    prompt's blocks count as cached there, for a policy that reads them)."""
    held = request.names if names else ()
    if est is None:
        blocks = -(-(request.prompt_len + 1) // view.state.block_size)
        return Pending(view.next_ordinal(), 0, 0.0, 0.0, blocks, held)
    return Pending(
        view.next_ordinal(), est.level, est.prefill_profile, est.expected, est.blocks, held
    )

"""The router's view of one replica's prefix cache: content names by tier.

Fed by the replica's block events (fsd.kv.prefix_events) in push order; a full state
replaces it. It is approximate (a lost push leaves it stale until the resync, and
two blocks of one content on a tier are one name here) but bounded: it never holds
more names than the replica has blocks, since a replica caches a name at most once
per tier; past that bound it has drifted, empties itself and asks for a resync.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fsd.kv.prefix_events import DEVICE, HOST, STORED, EventTuple

SLACK = 1024  # names over the replica's blocks tolerated before a resync


class PrefixIndex:
    """Content name -> the tiers (DEVICE | HOST bits) one replica caches it on."""

    def __init__(self) -> None:
        self.tiers: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.tiers)

    def apply(self, events: Iterable[EventTuple], full: bool, capacity: int) -> bool:
        """Apply a push's events (`full`: they are everything cached); False when the
        index outgrew `capacity` names and was emptied (ask for a resync)."""
        tiers = self.tiers
        if full:
            tiers.clear()
        for kind, tier, name in events:
            held = tiers.get(name, 0)
            if kind == STORED:
                tiers[name] = held | tier
            elif held & tier:
                rest = held & ~tier
                if rest:
                    tiers[name] = rest
                else:
                    del tiers[name]
        if len(tiers) > capacity + SLACK:
            tiers.clear()
            return False
        return True

    def match(self, names: Sequence[int], pending: dict[int, int] | None = None) -> tuple[int, int]:
        """(found, on host): the request's leading blocks cached on either tier (or soon
        on the device: `pending`, names of requests routed there but not yet seen),
        and how many of those only the host holds (they come back by copy)."""
        get = self.tiers.get
        found = host = 0
        for name in names:
            tiers = get(name, 0)
            if tiers & DEVICE or (pending and name in pending):
                found += 1
            elif tiers & HOST:
                found += 1
                host += 1
            else:
                break
        return found, host

    def blocks(self, tier: int = DEVICE | HOST) -> int:
        """Names cached on `tier` (either, by default)."""
        return sum(1 for t in self.tiers.values() if t & tier)

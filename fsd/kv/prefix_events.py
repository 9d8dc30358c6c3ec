"""The prefix cache's block events: what a router far from the replica needs of it.

Names. The cache's uids are its own (interned per replica), so a router comparing
replicas needs a name that only the content decides: a block's *content name* is
`block_name(parent's content name, its content)`, from `ROOT_NAME` for a sequence's
first block, the same chain as the uids. Python's hash of a tuple of ints (the
engine's token ids; the simulator's (prefix hash, index) pairs) is the same in every
process of one Python version, so every replica and the router compute the same
names; `chain_names` names a prompt's blocks the way the cache names them.

Events. `BlockEvents`, attached to a `PrefixCache` (its `events`), hears each time a
uid becomes cached on a tier or leaves it, and logs (kind, tier, content name).
Why a log and not a diff: the cache holds up to a pool of blocks per tier, and a
diff walks them all; a log costs O(1) per event. It is bounded: past `limit` events
since the last `drain` it stops logging and says so (`overflowed`), and the reader
asks for the whole set instead (`snapshot`). A uid's content name is remembered from
when it is first stored on a tier until no tier holds it, so a removal names what
the store named.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

ROOT_NAME = 0  # the content name a sequence's first block chains from
ROOT_UID = 0  # fsd.kv.prefix.ROOT: the uid a first block's key names as its parent
STORED, REMOVED = 1, 0  # event kinds
DEVICE, HOST = 1, 2  # tiers (bits: a name may be cached on both)
EventTuple = tuple[int, int, int]  # (STORED or REMOVED, DEVICE or HOST, content name)


def block_name(parent: int, content: Hashable) -> int:
    """The content name of a block whose prefix before it is named `parent`."""
    return hash((parent, content))


def chain_names(contents: Iterable[Hashable | None]) -> list[int]:
    """The content names of a sequence's leading full blocks, stopping at a None."""
    names: list[int] = []
    parent = ROOT_NAME
    for content in contents:
        if content is None:
            break
        parent = block_name(parent, content)
        names.append(parent)
    return names


class BlockEvents:
    """A bounded log of the blocks a prefix cache stores and removes, by content name.

    `keys` is the cache's uid -> (parent uid, content) table, read when a uid is
    first stored (its parent's name is known by then, or derived the same way)."""

    def __init__(self, keys: dict[int, tuple[int, Any]], limit: int = 65536) -> None:
        self.keys = keys
        self.limit = limit
        self.log: list[EventTuple] = []
        self.overflowed = True  # nothing sent yet: the first read takes a snapshot
        self._names: dict[int, int] = {}  # uid -> content name, while a tier holds it
        self._tiers: dict[int, int] = {}  # uid -> the tiers holding it (bits)
        # (name, tier) -> uids holding it there: two uids of one content (a chain
        # interned again after its parent was forgotten) are one name to the router
        self._count: dict[tuple[int, int], int] = {}

    def name_of(self, uid: int) -> int:
        """The uid's content name (derived through its parents the first time)."""
        known, start = self._names, uid
        contents: list[Any] = []  # from `uid` up to the first ancestor named
        while uid not in known:
            if uid == ROOT_UID:
                name = ROOT_NAME
                break
            key = self.keys.get(uid)
            if key is None:  # an ancestor was forgotten: unreachable here, never matched
                return block_name(ROOT_NAME, ("fsd-orphan", start))
            contents.append(key[1])
            uid = key[0]
        else:
            name = known[uid]
        for content in reversed(contents):
            name = block_name(name, content)
        return name

    def stored(self, uid: int, tier: int) -> None:
        """`uid` is now cached on `tier`."""
        held = self._tiers.get(uid, 0)
        if held & tier:
            return
        if not held:
            self._names[uid] = self.name_of(uid)
        self._tiers[uid] = held | tier
        key = (self._names[uid], tier)
        count = self._count.get(key, 0)
        self._count[key] = count + 1
        if not count:
            self._add(STORED, tier, key[0])

    def removed(self, uid: int, tier: int) -> None:
        """`uid` left `tier` (evicted, or moved down)."""
        held = self._tiers.get(uid, 0)
        if not held & tier:
            return
        key = (self._names[uid], tier)
        count = self._count[key] - 1
        if count:
            self._count[key] = count
        else:
            del self._count[key]
            self._add(REMOVED, tier, key[0])
        if held == tier:
            del self._tiers[uid], self._names[uid]
        else:
            self._tiers[uid] = held & ~tier

    def reset(self) -> None:
        """The cache forgot everything (`PrefixCache.clear`)."""
        self._names.clear()
        self._tiers.clear()
        self._count.clear()
        self.log.clear()
        self.overflowed = True

    def _add(self, kind: int, tier: int, name: int) -> None:
        if self.overflowed:
            return  # the next read is a snapshot anyway
        if len(self.log) >= self.limit:
            self.log.clear()
            self.overflowed = True
            return
        self.log.append((kind, tier, name))

    def drain(self) -> list[EventTuple] | None:
        """The events since the last drain, oldest first; None when some were lost
        (then `snapshot` is the truth). Either way the log starts afresh."""
        lost, events = self.overflowed, self.log
        self.log, self.overflowed = [], False
        return None if lost else events

    def snapshot(self) -> list[EventTuple]:
        """Every name cached now, as STORED events (what a resync sends)."""
        return [(STORED, tier, name) for name, tier in self._count]

    def seed(self, on_device: Iterable[int], on_host: Iterable[int]) -> None:
        """Start from what the cache already holds (attached to a running cache)."""
        self.overflowed = True  # logs nothing: the first read is a snapshot
        for tier, uids in ((DEVICE, on_device), (HOST, on_host)):
            for uid in uids:
                self.stored(uid, tier)
        self.log.clear()


def watch(cache: Any, limit: int = 65536) -> BlockEvents:
    """Attach a `BlockEvents` to a `PrefixCache` (seeded with what it holds)."""
    events = BlockEvents(cache._key, limit)
    events.seed(cache.on_device, cache.on_host)
    cache.events = events
    return events

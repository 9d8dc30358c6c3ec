"""The order the batch walk takes the queue in, and who may start past the admission
room: the swap gate's express lane and owners' leads (rules of `fsd.sched.rules`).

The gate lets no job without KV start while started work fills the device, so a
short job could wait behind long started ones. Two orderings let short jobs by:

- **express lane**: a job without KV that comes before every started job in the
  walk, with at most what decodes within the policy's waiting alpha still to make
  and less than every started job has left, starts past the room. It ends about
  when the policy would have lifted it anyway, so it sends a started job to host
  memory once at most; long and identical new jobs stay behind.
- **owners' leads**: a short job (as above) whose owner has no started job is found
  at the head of its level and walked first, one per owner and half a batch at most.
  With one owner (the simulator, the offline API) there are none.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from fsd.cost import CostModel
from fsd.jobs import Job, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.sched.queues import JobQueue
from fsd.sched.rules import WalkRules

_owner = operator.attrgetter("owner")
# Jobs looked at per batch slot where the walk looks ahead (the head of the queue, past
# a full batch, prefills over the token budget): enough to find the few that matter,
# bounded so a flood of thousands is never walked past.
LOOK_AHEAD = 4
# owners' leads take at most 1/LEAD_SHARE of a batch: started work keeps the rest
LEAD_SHARE = 2
# the walk sorts the started jobs alone while they are under 1/SORT_STARTED of the
# queue: fewer to sort than there would be waiting jobs to pass over
SORT_STARTED = 4


@dataclass
class Leads:
    """Who may start past the admission room, as one iteration's walk goes on."""

    express: int  # most tokens a short job may still have to make (`express_tokens`)
    started: list[Job]  # the started jobs: a short job has fewer tokens left than each
    owners: set[str | None]  # owners with a started job (grows as the walk starts jobs)
    rules: WalkRules
    ahead: bool = True  # no job started or walked with KV yet: the express lane is open

    @functools.cached_property
    def bound(self) -> int:
        """Most tokens a short job may still have to make (0: nobody); found on first
        use: most jobs are ruled out by `express` alone."""
        if not self.express or not self.started:
            return self.express
        return min(
            self.express, min([j.max_output - j.num_output_tokens for j in self.started]) - 1
        )

    def may_pass(self, job: Job) -> bool:
        """`job` (without KV) may start past the room: it is short, and ahead of every
        started job (express lane) or of an owner with none (owners' leads)."""
        rules = self.rules
        if not (self.ahead and rules.express or rules.owner_leads and job.owner not in self.owners):
            return False
        left = job.max_output - job.num_output_tokens
        return left <= self.express and left <= self.bound

    def closed(self, live_owners: AbstractSet[str | None]) -> bool:
        """No job may pass the room for the rest of this walk: the express lane is shut
        (it never opens again) and every live job's owner has a started job (the owners
        only grow)."""
        return not (self.ahead and self.rules.express or self.owners_may_lead(live_owners))

    def owners_may_lead(self, live_owners: AbstractSet[str | None]) -> bool:
        """Some live job's owner has no started job: it may lead (`owner_leads`)."""
        return self.rules.owner_leads and bool(live_owners - self.owners)


def express_tokens(queue: JobQueue, cost: CostModel, rules: WalkRules) -> int:
    """Tokens a short job may still have to make: what decodes within the policy's
    waiting alpha; 0 without the swap gate or a waiting alpha."""
    _, _, waiting = queue.limits()
    step, _ = cost.decode_line()
    if not rules.swap_gate or not waiting or step <= 0:
        return 0
    return int(waiting / step)


def leads_now(queue: JobQueue, cost: CostModel, blocks: BlockManager, rules: WalkRules) -> Leads:
    """`express_tokens`, and fewer than any started job has left to its cap; and the
    owners of the started jobs (when `express_tokens` is not 0)."""
    express = express_tokens(queue, cost, rules)
    if not express:
        return Leads(0, [], set(), rules)
    started: list[Job] = [*blocks.on_device.values(), *blocks.on_host.values()]  # type: ignore[list-item]
    return Leads(express, started, set(map(_owner, started)), rules)


def owner_leads(queue: JobQueue, newest: Iterable[Job], leads: Leads, limit: int) -> list[Job]:
    """Short jobs without KV whose owner has no started job, from the head of each
    level (its turn) or an owner's latest job (an owner whose jobs finished has turns
    of its own, behind a flood's jobs that never run there), in priority order, one per
    owner and half a batch at most: started work keeps the rest."""
    owners, bound = leads.owners, leads.bound
    if not leads.rules.owner_leads or not owners or not bound:
        return []
    heads = itertools.chain(queue.heads(LOOK_AHEAD * limit), newest)
    found = [
        job for job in heads if job.kv is KVLocation.NONE and job.owner not in owners
        and job.max_output - job.num_output_tokens <= bound
    ]  # fmt: skip
    first: dict[str | None, Job] = {}
    for job in sorted(found, key=queue.key):
        if len(first) >= max(1, limit // LEAD_SHARE):
            break
        first.setdefault(job.owner, job)
    return list(first.values())


def walk_order(
    queue: JobQueue, blocks: BlockManager, queued: int, admit_room: float, limit: int
) -> Iterable[Job]:
    """The jobs to walk, in priority order.

    When admission lets no job without KV start, only the jobs holding KV can run
    (and the express lane's jobs, which come first); with a long queue of waiting jobs
    sorting those few beats walking past thousands that would all be skipped.
    """
    if admit_room < 1:
        on_device, on_host = blocks.on_device, blocks.on_host
        if SORT_STARTED * (len(on_device) + len(on_host)) < queued:
            started = sorted(
                itertools.chain(on_device.values(), on_host.values()),  # type: ignore[arg-type]
                key=queue.key,
            )
            return itertools.chain(_ahead_of_started(queue, limit), started)
    return queue.ordered()


def _ahead_of_started(queue: JobQueue, limit: int) -> list[Job]:
    """The jobs without KV that come before every started job, of the first few of the
    queue's order."""
    ahead = []
    for job in itertools.islice(queue.ordered(), LOOK_AHEAD * limit):
        if job.kv is not KVLocation.NONE:
            break
        ahead.append(job)
    return ahead


def first_for(job: Job, key: Callable[[Job], tuple]) -> Callable[[Job], tuple]:
    """`key`, but `job` ranks above every job (an owner's lead may evict any started one)."""
    return lambda j: (-math.inf,) if j is job else key(j)

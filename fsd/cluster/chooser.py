"""fsd.router's `Router` as the replica set's chooser: each replica's pushed state goes
to the router (a lost push makes that replica send a full one), each job's prompt
block names and affinity key go to its choice."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set

from fsd.cluster.worker import Report
from fsd.router import Router, RouteRequest, prompt_names


class RouterChooser:
    """Chooses with a `Router`; `resync(i)` asks replica i for a full state."""

    def __init__(self, router: Router, resync: Callable[[int], None]) -> None:
        self.router = router
        self._resync = resync

    def choose(
        self, job_id: str, prompt: Sequence[int], affinity: str | None, avoid: Set[int]
    ) -> tuple[int, str]:
        names = prompt_names(prompt, self.router.block_size)
        decision = self.router.choose(RouteRequest(job_id, len(prompt), names, affinity), avoid)
        return decision.replica, decision.reason

    def observe(self, index: int, report: Report) -> None:
        if report.state is not None and self.router.update(report.state):
            self._resync(index)

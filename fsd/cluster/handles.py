"""Where the replicas run: in this process (`LocalReplicas`) or as Ray actors
(`RayReplicas`), behind one interface, `Replicas`.

On Ray each replica is one actor holding a `ReplicaWorker`, placed in a placement
group of its own (`groups`): on GPUs the actor takes the GPU of a tp = pp = 1
replica, and a larger replica's engine starts its tp x pp workers from inside the
actor, one per reserved GPU bundle; on CPU it takes its share of the cores and runs
that many torch threads. The actor serves several calls at once (a poll must not wait
behind a call), which is safe: the worker's own thread alone touches the engine.

A replica that dies (its actor or process gone, its thread stopped) is marked down
with why, the first time any door finds it so; a fresh one is then started in the
background and takes its index once its model is loaded (`revived`). Calls to a
replica that is down raise `ReplicaDown` at once; `call_all` and `poll` skip it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fsd.cluster.groups import ReplicaGroups, ReplicaShape
from fsd.cluster.worker import Fixed, ReplicaDown, ReplicaWorker, Report
from fsd.config import EngineConfig
from fsd.errors import FsdError
from fsd.jobs import SamplingParams

log = logging.getLogger("fsd.cluster")
_CALLS_AT_ONCE = 4  # an actor's concurrent calls: a poll, a call, an admission


class Replicas(ABC):
    """N replicas behind one interface; each is addressed by its index (module doc).
    A kind of replica (in process, Ray) provides the abstract methods."""

    def __init__(self, configs: Sequence[EngineConfig], routed: float | None) -> None:
        self.configs = list(configs)
        self.routed = routed
        self.down: dict[int, str] = {}  # replicas found dead, and why
        self._restarts: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsd-restart")
        self.workers: list[Any] = [self._spawn(i) for i in range(len(self.configs))]

    def __len__(self) -> int:
        return len(self.workers)

    def up(self) -> list[int]:
        """The replicas not down."""
        return [i for i in range(len(self)) if i not in self.down]

    def fixed(self) -> list[Fixed]:
        return [self.call(i, "fixed") for i in range(len(self))]

    # ---- the doors ---------------------------------------------------------------------

    def admit(
        self, index: int, ids: Sequence[int], params: SamplingParams, job_id: str,
        arrival: float, tags: Sequence[str], owner: str | None = None,
    ) -> None:  # fmt: skip
        args = (list(ids), params, job_id, arrival, list(tags), owner)
        self._guard(index, self._admit, index, *args)

    def call(self, index: int, name: str, *args: Any) -> Any:
        """A verb on one replica (ReplicaDown if it is down or dies now)."""
        return self._guard(index, self._call, index, name, *args)

    def call_all(self, name: str, *args: Any) -> dict[int, Any]:
        """A verb on every replica that is up: {index: answer}."""
        answers = {}
        for i in self.up():
            try:
                answers[i] = self.call(i, name, *args)
            except ReplicaDown:
                continue
        return answers

    def poll(self, timeout: float) -> list[Report]:
        """Every replica's report, waiting up to `timeout` for news from any; one that
        is down reports only that (`Report.down`)."""
        got = self._poll(self.up(), timeout)
        reports = []
        for i in range(len(self)):
            item = got.get(i)
            if isinstance(item, BaseException):
                self._died(i, item)
            reports.append(item if isinstance(item, Report) else Report(i, down=self.down.get(i)))
        return reports

    @abstractmethod
    def kill(self, index: int) -> None:
        """End a replica now, as a crash would (tests, and a replica to be replaced)."""

    def revived(self) -> list[int]:
        """The replicas whose fresh copy has come up since the last look."""
        back = []
        for i, future in list(self._restarts.items()):
            if not future.done():
                continue
            del self._restarts[i]
            try:
                self.workers[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - it stays down, saying why
                self.down[i] = f"{self.down.get(i)}; its restart failed: {exc}"
                log.error("replica %d: the restart failed: %s", i, exc)
                continue
            self.down.pop(i, None)
            log.info("replica %d is back", i)
            back.append(i)
        return back

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- what each kind provides -------------------------------------------------------

    @abstractmethod
    def _spawn(self, index: int) -> Any:
        """A fresh worker for replica `index` (its model loads there)."""

    @abstractmethod
    def _admit(self, index: int, *args: Any) -> None:
        """Queue a checked request on replica `index` (`ReplicaWorker.admit`'s args)."""

    @abstractmethod
    def _call(self, index: int, name: str, *args: Any) -> Any:
        """A verb on replica `index`, its answer (`ReplicaWorker.call`)."""

    @abstractmethod
    def _poll(self, indices: list[int], timeout: float) -> dict[int, Report | BaseException]:
        """Those replicas' reports (or why one could not answer), waiting up to
        `timeout` for news from any."""

    def _is_death(self, exc: BaseException) -> bool:
        return isinstance(exc, ReplicaDown)

    # ---- faults ------------------------------------------------------------------------

    def _guard(self, index: int, door: Callable[..., Any], *args: Any) -> Any:
        if index in self.down:
            raise ReplicaDown(f"replica {index} is down: {self.down[index]}")
        try:
            return door(*args)
        except BaseException as exc:
            if not self._is_death(exc):
                raise
            self._died(index, exc)
            raise ReplicaDown(f"replica {index} is down: {self.down[index]}") from None

    def _died(self, index: int, exc: BaseException) -> None:
        if index in self.down:
            return
        lines = _lines(exc) or [""]
        tail = f" ({lines[-1]})" if len(lines) > 1 else ""  # Ray's own last line says why
        self.down[index] = f"{type(exc).__name__}: {lines[0]}{tail}"[:300]
        log.error("replica %d is down (%s); starting a fresh one", index, self.down[index])
        self._restarts[index] = self._pool.submit(self._replace, index)

    def _replace(self, index: int) -> Any:
        worker = self._spawn(index)
        self._ready(worker)
        return worker

    def _ready(self, worker: Any) -> None:  # noqa: B027 - a hook: in process, built ready
        """Wait until a fresh worker serves (its model loaded)."""


class LocalReplicas(Replicas):
    """Replicas in this process, each on its own thread (tests; one machine, no Ray)."""

    def __init__(self, configs: Sequence[EngineConfig], routed: float | None) -> None:
        self._news = threading.Condition()  # any replica's news wakes a waiting poll
        super().__init__(configs, routed)

    def _spawn(self, index: int) -> ReplicaWorker:
        return ReplicaWorker(self.configs[index], index, self.routed, self._news)

    def _admit(self, index: int, *args: Any) -> None:
        self.workers[index].admit(*args)

    def _call(self, index: int, name: str, *args: Any) -> Any:
        return self.workers[index].call(name, *args)

    def _poll(self, indices: list[int], timeout: float) -> dict[int, Report | BaseException]:
        workers = [self.workers[i] for i in indices]
        with self._news:
            if timeout > 0 and not any(w.has_news() for w in workers):
                self._news.wait(timeout)
        got: dict[int, Report | BaseException] = {}
        for i, w in zip(indices, workers, strict=True):
            try:
                got[i] = w.poll()
            except ReplicaDown as exc:
                got[i] = exc
        return got

    def kill(self, index: int) -> None:
        self.workers[index].close()

    def close(self) -> None:
        super().close()
        for w in self.workers:
            w.close()


class RayReplicas(Replicas):
    """Replicas as Ray actors (module doc), each in a placement group of its own
    (`fsd.cluster.groups`): its actor and its tp x pp workers reserved together."""

    def __init__(
        self,
        configs: Sequence[EngineConfig],
        routed: float | None,
        address: str | None,
        shape: ReplicaShape,
    ) -> None:
        from fsd.engine.ray_cluster import ensure_ray

        self.ray, self._started = ensure_ray(address)
        try:
            self.groups = ReplicaGroups(self.ray, shape, len(configs))
        except BaseException:
            if self._started:
                self.ray.shutdown()
            raise
        self._actor = self.ray.remote(ReplicaWorker)
        self._sent = [0] * len(configs)  # admissions sent to each: its calls come after
        super().__init__(configs, routed)
        self._first_start()
        log.info(
            "%d replicas as Ray actors, each reserving %s", len(configs), shape.bundles()
        )  # fmt: skip

    def _spawn(self, index: int) -> Any:
        self._sent[index] = 0
        options = self.groups.options(index)
        return self._actor.options(max_concurrency=_CALLS_AT_ONCE, **options).remote(
            self.configs[index], index, self.routed
        )

    def _ready(self, worker: Any) -> None:
        self.ray.get(worker.call.remote("fixed"))

    def _first_start(self) -> None:
        """Every replica up, or the first one's failure as one error (a replica that
        cannot start at all is not restarted in a loop)."""
        try:
            for worker in self.workers:
                self._ready(worker)
        except self.ray.exceptions.RayActorError as exc:
            self.close()
            lines = _lines(exc)
            raise FsdError(f"a replica failed to start: {lines[-1] if lines else exc}") from None

    def _admit(self, index: int, *args: Any) -> None:
        self.workers[index].admit.remote(*args)
        self._sent[index] += 1

    def _call(self, index: int, name: str, *args: Any) -> Any:
        return self.ray.get(self.workers[index].call.remote(name, *args, after=self._sent[index]))

    def _poll(self, indices: list[int], timeout: float) -> dict[int, Report | BaseException]:
        refs = {i: self.workers[i].poll.remote(timeout) for i in indices}
        got: dict[int, Report | BaseException] = {}
        for i, ref in refs.items():
            try:
                got[i] = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                got[i] = exc
        return got

    def _is_death(self, exc: BaseException) -> bool:
        return isinstance(exc, ReplicaDown | self.ray.exceptions.RayActorError)

    def kill(self, index: int) -> None:
        self.ray.kill(self.workers[index], no_restart=True)

    def close(self) -> None:
        super().close()
        refs = [self.workers[i].close.remote() for i in self.up()]
        try:
            self.ray.get(refs, timeout=30)
        except Exception:  # noqa: BLE001 - leaving anyway
            log.warning("a replica did not close in time")
        for w in self.workers:
            self.ray.kill(w)
        self.groups.close()
        if self._started:
            self.ray.shutdown()


def _lines(exc: BaseException) -> list[str]:
    """An error's non-blank lines (Ray's last one says why an actor died)."""
    return [line.strip() for line in str(exc).splitlines() if line.strip()]


def replica_configs(config: EngineConfig, n: int, threads: int | None) -> list[EngineConfig]:
    """Each replica's config: the daemon's, with its share of the CPU threads (split
    among its tp x pp workers when it has several)."""
    world = config.parallel.tp * config.parallel.pp
    share = max(1, threads // world) if threads else config.model.threads
    model = dataclasses.replace(config.model, threads=share)
    return [dataclasses.replace(config, model=model) for _ in range(n)]

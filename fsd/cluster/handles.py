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

Nothing here waits on a replica without a deadline: a poll is asked once and gathered
when it answers (the daemon's loop waits at most its timeout, whoever is late), and a
replica whose poll has not answered for `HUNG_AFTER` seconds (a stopped process, a
stuck actor) is hung: marked down as if dead, killed, and replaced. A call waits at
most `CALL_TIMEOUT`, then the replica is hung too. An error a replica raises reaches
the caller as itself, never as Ray's wrapping of it (a traceback, a pid, paths).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import Any

from fsd.admission import JobRequest
from fsd.cluster.groups import ReplicaGroups, ReplicaShape
from fsd.cluster.worker import Fixed, ReplicaDown, ReplicaWorker, Report
from fsd.config import EngineConfig
from fsd.errors import FsdError

log = logging.getLogger("fsd.cluster")
_CALLS_AT_ONCE = 4  # an actor's concurrent calls: a poll, a call, an admission
HUNG_AFTER = 5.0  # seconds a replica's poll may go unanswered before it counts as hung
CALL_TIMEOUT = 10.0  # seconds a call may take (a step or two) before the same


class ReplicaHung(ReplicaDown):
    """A replica stopped answering (its process stopped or stuck)."""


class Replicas(ABC):
    """N replicas behind one interface; each is addressed by its index (module doc).
    A kind of replica (in process, Ray) provides the abstract methods."""

    def __init__(self, configs: Sequence[EngineConfig], routed: float | None) -> None:
        self.configs = list(configs)
        self.routed = routed
        self.down: dict[int, str] = {}  # replicas found dead, and why
        self._restarts: dict[int, Future] = {}
        self._asked: dict[int, tuple[Any, float]] = {}  # polls not answered yet, and since
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

    def admit(self, index: int, request: JobRequest) -> None:
        """Queue an admitted request (named, its arrival set) on replica `index`."""
        self._guard(index, self._admit, index, request)

    def call(self, index: int, name: str, *args: Any) -> Any:
        """A verb on one replica (ReplicaDown if it is down, dies or hangs now)."""
        return self._guard(index, self._call, index, name, *args)

    def tell(self, index: int, name: str, *args: Any) -> None:
        """A verb on one replica, not waited for (ReplicaDown if it is down)."""
        self._guard(index, self._tell, index, name, *args)

    def call_all(self, name: str, *args: Any) -> dict[int, Any]:
        """A verb on every replica that is up: {index: answer}."""
        return self.call_all_of(self.up(), name, *args)

    def call_all_of(self, indices: Sequence[int], name: str, *args: Any) -> dict[int, Any]:
        """A verb on those replicas that are up: {index: answer}."""
        answers = {}
        for i in indices:
            try:
                answers[i] = self.call(i, name, *args)
            except ReplicaDown:
                continue
        return answers

    def poll(self, timeout: float) -> list[Report]:
        """Every replica's report, waiting up to `timeout` for any (module doc); one
        that is down reports only that (`Report.down`), one still asked nothing."""
        now = time.monotonic()
        for i in self.up():
            if i not in self._asked:
                try:
                    self._asked[i] = (self._ask(i, timeout), now)
                except BaseException as exc:  # noqa: BLE001 - its death, below
                    self._died(i, exc)
        got = self._gather({i: h for i, (h, _) in self._asked.items()}, timeout)
        reports = []
        for i in range(len(self)):
            item = got.get(i)
            if item is not None:
                self._asked.pop(i, None)
            elif i in self._asked and time.monotonic() - self._asked[i][1] > HUNG_AFTER:
                item = ReplicaHung(f"its poll went unanswered for {HUNG_AFTER:g} s")
                self._asked.pop(i)
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
    def _admit(self, index: int, request: JobRequest) -> None:
        """Queue an admitted request on replica `index` (`ReplicaWorker.admit`)."""

    @abstractmethod
    def _call(self, index: int, name: str, *args: Any) -> Any:
        """A verb on replica `index`, its answer (`ReplicaWorker.call`), within
        CALL_TIMEOUT (else ReplicaHung)."""

    @abstractmethod
    def _tell(self, index: int, name: str, *args: Any) -> None:
        """A verb on replica `index`, not waited for (`ReplicaWorker.tell`)."""

    @abstractmethod
    def _ask(self, index: int, timeout: float) -> Any:
        """Ask replica `index` for its report (waiting up to `timeout` for news there):
        a handle for `_gather`."""

    @abstractmethod
    def _gather(self, asked: dict[int, Any], timeout: float) -> dict[int, Report | BaseException]:
        """The answers (or why one could not answer) of the asked polls that came within
        about `timeout`; the others stay asked."""

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
        self._asked.pop(index, None)
        if isinstance(exc, ReplicaHung):  # alive but silent: it must not come back
            try:
                self.kill(index)
            except Exception as error:  # noqa: BLE001 - replaced all the same
                log.warning("replica %d: could not kill the hung copy: %s", index, error)
        log.error("replica %d is down (%s); starting a fresh one", index, self.down[index])
        self._restarts[index] = self._pool.submit(self._replace, index)

    def _replace(self, index: int) -> Any:
        worker = self._spawn(index)
        self._ready(worker)
        return worker

    def _ready(self, worker: Any) -> None:  # noqa: B027 - a hook: in process, built ready
        """Wait until a fresh worker serves (its model loaded)."""


class LocalReplicas(Replicas):
    """Replicas in this process, each on its own thread (tests; one machine, no Ray);
    its polls run on a small pool of threads, so that one hung replica holds no other."""

    def __init__(self, configs: Sequence[EngineConfig], routed: float | None) -> None:
        self._asker = ThreadPoolExecutor(max_workers=2 * len(configs), thread_name_prefix="fsd-poll")
        super().__init__(configs, routed)

    def _spawn(self, index: int) -> ReplicaWorker:
        return ReplicaWorker(self.configs[index], index, self.routed)

    def _admit(self, index: int, request: JobRequest) -> None:
        self.workers[index].admit(request)

    def _call(self, index: int, name: str, *args: Any) -> Any:
        try:
            return self.workers[index].call(name, *args, timeout=CALL_TIMEOUT)
        except FutureTimeout:
            raise ReplicaHung(f"a call ({name}) went unanswered for {CALL_TIMEOUT:g} s") from None

    def _tell(self, index: int, name: str, *args: Any) -> None:
        self.workers[index].tell(name, *args)

    def _ask(self, index: int, timeout: float) -> Future:
        return self._asker.submit(self.workers[index].poll, timeout)

    def _gather(self, asked: dict[int, Future], timeout: float) -> dict[int, Report | BaseException]:
        wait_futures(list(asked.values()), timeout=timeout + 0.05)
        got: dict[int, Report | BaseException] = {}
        for i, future in asked.items():
            if future.done():
                exc = future.exception()
                got[i] = exc if exc is not None else future.result()
        return got

    def _is_death(self, exc: BaseException) -> bool:
        return isinstance(exc, ReplicaDown)

    def kill(self, index: int) -> None:
        self.workers[index].close(wait=0.0)

    def close(self) -> None:
        super().close()
        for w in self.workers:
            w.close()
        self._asker.shutdown(wait=False, cancel_futures=True)


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

    def _admit(self, index: int, request: JobRequest) -> None:
        self.workers[index].admit.remote(request)
        self._sent[index] += 1

    def _call(self, index: int, name: str, *args: Any) -> Any:
        ref = self.workers[index].call.remote(name, *args, after=self._sent[index])
        try:
            return self.ray.get(ref, timeout=CALL_TIMEOUT)
        except self.ray.exceptions.GetTimeoutError:
            raise ReplicaHung(f"a call ({name}) went unanswered for {CALL_TIMEOUT:g} s") from None
        except self.ray.exceptions.RayTaskError as exc:  # the replica's own error, unwrapped
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            lines = _lines(exc)
            raise FsdError(f"replica {index}: {lines[-1] if lines else type(exc).__name__}") from None

    def _tell(self, index: int, name: str, *args: Any) -> None:
        self.workers[index].tell.remote(name, *args)
        self._sent[index] += 1

    def _ask(self, index: int, timeout: float) -> Any:
        return self.workers[index].poll.remote(timeout)

    def _gather(self, asked: dict[int, Any], timeout: float) -> dict[int, Report | BaseException]:
        index_of = {ref: i for i, ref in asked.items()}
        ready, _ = self.ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout + 0.05)
        got: dict[int, Report | BaseException] = {}
        for ref in ready:
            try:
                got[index_of[ref]] = self.ray.get(ref, timeout=1.0)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as exc:
                got[index_of[ref]] = exc
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

"""Where the replicas run: in this process (`LocalReplicas`) or as Ray actors
(`RayReplicas`), behind one interface, `Replicas`.

On Ray each replica is one actor holding a `ReplicaWorker`: on GPUs the actor takes
the GPU of a tp = pp = 1 replica (a larger replica's engine starts its own tp x pp
workers from inside the actor); on CPU it takes its share of the cores and runs that
many torch threads. The actor serves several calls at once (a poll must not wait
behind a call), which is safe: the worker's own thread alone touches the engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fsd.cluster.worker import Fixed, ReplicaWorker, Report
from fsd.config import EngineConfig
from fsd.engine.face import EngineFace
from fsd.jobs import SamplingParams

log = logging.getLogger("fsd.cluster")
_CALLS_AT_ONCE = 4  # an actor's concurrent calls: a poll, a call, an admission


class Replicas:
    """N replicas behind one interface; each is addressed by its index."""

    workers: list[Any]

    def __len__(self) -> int:
        return len(self.workers)

    def fixed(self) -> list[Fixed]:
        return [self.call(i, "fixed") for i in range(len(self))]

    def admit(
        self, index: int, ids: Sequence[int], params: SamplingParams, job_id: str,
        arrival: float, tags: Sequence[str],
    ) -> None:  # fmt: skip
        raise NotImplementedError

    def call(self, index: int, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def call_all(self, name: str, *args: Any) -> list[Any]:
        return [self.call(i, name, *args) for i in range(len(self))]

    def poll(self, timeout: float) -> list[Report]:
        """Every replica's report, waiting up to `timeout` for news from any."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class LocalReplicas(Replicas):
    """Replicas in this process, each on its own thread (tests; one machine, no Ray)."""

    def __init__(
        self, configs: Sequence[EngineConfig], state_of: Callable[[EngineFace], Any] | None
    ) -> None:
        self._news = threading.Condition()  # any replica's news wakes a waiting poll
        self.workers = [ReplicaWorker(c, i, state_of, self._news) for i, c in enumerate(configs)]

    def admit(
        self, index: int, ids: Sequence[int], params: SamplingParams, job_id: str,
        arrival: float, tags: Sequence[str],
    ) -> None:  # fmt: skip
        self.workers[index].admit(ids, params, job_id, arrival, tags)

    def call(self, index: int, name: str, *args: Any) -> Any:
        return self.workers[index].call(name, *args)

    def poll(self, timeout: float) -> list[Report]:
        with self._news:
            if timeout > 0 and not any(w.has_news() for w in self.workers):
                self._news.wait(timeout)
        return [w.poll() for w in self.workers]

    def close(self) -> None:
        for w in self.workers:
            w.close()


class RayReplicas(Replicas):
    """Replicas as Ray actors (module doc); `cpus` each on CPU, one GPU each on GPUs."""

    def __init__(
        self,
        configs: Sequence[EngineConfig],
        state_of: Callable[[EngineFace], Any] | None,
        address: str | None,
        gpus: float,
        cpus: int,
    ) -> None:
        from fsd.engine.ray_cluster import ensure_ray

        self.ray, self._started = ensure_ray(address)
        actor = self.ray.remote(ReplicaWorker).options(
            num_cpus=cpus, num_gpus=gpus, max_concurrency=_CALLS_AT_ONCE
        )
        self.workers = [actor.remote(c, i, state_of) for i, c in enumerate(configs)]
        self._sent = [0] * len(configs)  # admissions sent to each: its calls come after
        log.info(
            "%d replicas as Ray actors (%d CPUs%s each)", len(configs), cpus,
            f", {gpus:g} GPU" if gpus else "",
        )  # fmt: skip

    def admit(
        self, index: int, ids: Sequence[int], params: SamplingParams, job_id: str,
        arrival: float, tags: Sequence[str],
    ) -> None:  # fmt: skip
        self.workers[index].admit.remote(list(ids), params, job_id, arrival, list(tags))
        self._sent[index] += 1

    def call(self, index: int, name: str, *args: Any) -> Any:
        return self.ray.get(self.workers[index].call.remote(name, *args, after=self._sent[index]))

    def call_all(self, name: str, *args: Any) -> list[Any]:
        refs = [w.call.remote(name, *args, after=n) for w, n in zip(self.workers, self._sent, strict=True)]
        return self.ray.get(refs)

    def poll(self, timeout: float) -> list[Report]:
        return self.ray.get([w.poll.remote(timeout) for w in self.workers])

    def close(self) -> None:
        refs = [w.close.remote() for w in self.workers]
        try:
            self.ray.get(refs, timeout=30)
        except Exception:  # noqa: BLE001 - leaving anyway
            log.warning("a replica did not close in time")
        for w in self.workers:
            self.ray.kill(w)
        if self._started:
            self.ray.shutdown()


def replica_configs(config: EngineConfig, n: int, threads: int | None) -> list[EngineConfig]:
    """Each replica's config: the daemon's, with its share of the CPU threads."""
    model = dataclasses.replace(config.model, threads=threads or config.model.threads)
    return [dataclasses.replace(config, model=model) for _ in range(n)]

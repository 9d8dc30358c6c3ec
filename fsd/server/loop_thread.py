"""An asyncio event loop on a daemon thread of its own, serving until stopped: what the
gate and the HTTP frontend each are (the engine thread never runs their loop)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod

from fsd.errors import ConfigError
from fsd.server.listen import quiet_accept_errors

log = logging.getLogger("fsd.server")


class LoopThread(ABC):
    """Runs `serve()` (a subclass's) on its own loop and thread. `serve` calls `ready()`
    once it serves, or stores why it cannot in `self._error` and returns; `stopped()`
    is the event it waits on until `signal_stop()`."""

    def __init__(self, name: str) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    async def serve(self) -> None:
        """Serve until `stopped()`; call `ready()` once serving (the subclass's)."""

    def start_thread(self, what: str, timeout: float) -> BaseException | None:
        """Start the thread and wait until it serves: None, or why it could not
        (ConfigError naming `what` if it neither serves nor fails within `timeout`)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ConfigError(f"{what} did not start")
        return self._error

    def signal_stop(self) -> None:
        """Ask the loop to stop serving (from any thread; a no-op once it has ended)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)

    def ready(self) -> None:
        self._ready.set()

    async def stopped(self) -> None:
        assert self._stop is not None
        await self._stop.wait()

    def _run(self) -> None:
        try:
            asyncio.run(self._begin())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
            else:
                log.exception("%s failed", self._thread.name)

    async def _begin(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(quiet_accept_errors)  # (listen: logged throttled)
        self._stop = asyncio.Event()
        await self.serve()

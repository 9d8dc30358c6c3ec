"""The HTTP frontend's links to the engine: a few clients, so that users do not share one fate.

Each link is an `AsyncClient` over the daemon's inproc endpoint, a session of its
own. A request takes the link with the fewest requests on it and holds it to its end
(its job belongs to that link's session). A link that fails at the connection level
(its socket gone or its reader failed: the client raises a `FsdError` that is not the
daemon's refusal, or `RequestError` "lost") is retired: a fresh link takes its place
at once, only the requests that were on it fail (503), and it is closed once they
have ended.

A job whose HTTP client left, or whose request failed, is aborted by its id on its
own link (`abandon`), retired or not. If that link cannot reach the daemon any more,
the daemon aborts the job itself: the link's session falls silent and is reaped
after `client_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from fsd.client import AsyncClient, AsyncJobHandle, RequestError
from fsd.errors import FsdError
from fsd.server.log_limits import Throttle

log = logging.getLogger("fsd.http")

LINKS = 4  # links per HTTP frontend
# what a link's calls raise: fsd's errors, and ZeroMQ's for a socket closed under it
LINK_ERRORS = (FsdError, zmq.ZMQError)


def link_failed(exc: BaseException) -> bool:
    """Whether `exc`, raised by a link's call or job, says the link itself failed
    (rather than the daemon refusing or ending that one request)."""
    if isinstance(exc, RequestError):
        return exc.code == "lost"
    return isinstance(exc, LINK_ERRORS)


@dataclass(eq=False)
class Link:
    """One engine client and the requests now on it."""

    client: AsyncClient
    busy: int = 0
    retired: bool = False


@dataclass(eq=False)
class LinkPool:
    """`size` links made by `make`; `pick` one per request, `release` it after."""

    make: Callable[[], AsyncClient]
    size: int = LINKS
    links: list[Link] = field(init=False)
    retired: int = 0  # links retired so far
    closed: bool = False
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _throttle: Throttle = field(default_factory=Throttle, init=False)

    def __post_init__(self) -> None:
        self.links = [Link(self.make()) for _ in range(self.size)]

    def pick(self) -> Link:
        """The least busy link (the first of equals), now holding one more request."""
        link = min(self.links, key=lambda li: li.busy)
        link.busy += 1
        return link

    def release(self, link: Link) -> None:
        link.busy -= 1
        if link.retired and link.busy == 0:  # its last request's abort has gone first
            self._spawn(_close_quietly(link.client))

    def retire(self, link: Link, exc: BaseException) -> None:
        """Replace a failed link and close it (its other requests fail with it)."""
        if link.retired or self.closed:  # (closing: every link fails, none is replaced)
            return
        link.retired = True
        self.retired += 1
        self.links[self.links.index(link)] = Link(self.make())
        held = self._throttle.take()
        if held is not None:
            log.warning("an engine link failed (%s); replaced (%d links so far)", exc, self.retired)

    def abandon(self, link: Link, handle: AsyncJobHandle) -> None:
        """Abort `handle`'s job unless it finished, in a task of its own.

        Unless it *finished*: a handle that ended in an error says nothing of the job,
        which may run on in the engine; it is aborted by its id, which the link's
        session owns. Its own task: the handler may be cancelled (its client left),
        and a cancelled coroutine should not wait for the daemon.
        """
        if handle.finished:  # its Finished arrived: the job is over
            return
        client, job_id = link.client, handle.job_id

        async def abort() -> None:
            # already ended, the daemon stopping, or the link gone (then the daemon reaps)
            with contextlib.suppress(*LINK_ERRORS):
                if job_id is not None:
                    await client.abort(job_id)
                elif not handle.done:  # not accepted yet: abort it once it is
                    await handle.abort()

        self._spawn(abort())

    async def close(self) -> None:
        """Close every link (their streaming jobs are aborted) and wait for the aborts."""
        self.closed = True
        for link in self.links:
            await _close_quietly(link.client)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)  # a strong reference until it is done
        task.add_done_callback(self._tasks.discard)


async def _close_quietly(client: AsyncClient) -> None:
    """Close a client whose socket may already be gone (then its aborts cannot leave)."""
    with contextlib.suppress(Exception):
        await client.close()

"""`python -m tests.server.link_breaker start ...`: the daemon, with a test hook that
breaks one HTTP engine link for real.

Whenever the file named by $FSD_BREAK_LINK appears, the HTTP frontend's busiest
engine link has its ZeroMQ socket closed under it, on its own loop (as a socket
failing would), and the file is removed. Nothing else differs from `fsd.cli`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from fsd.cli import app
from fsd.server.http import links

_pools: list[tuple[links.LinkPool, asyncio.AbstractEventLoop]] = []
_made = links.LinkPool.__post_init__


def _track(pool: links.LinkPool) -> None:
    _made(pool)
    _pools.append((pool, asyncio.get_running_loop()))


def _break(pool: links.LinkPool) -> None:
    link = max(pool.links, key=lambda li: li.busy)
    link.client._sock.close(linger=0)  # type: ignore[union-attr]


def _watch(path: str) -> None:
    while True:
        if os.path.exists(path):
            for pool, loop in _pools:
                loop.call_soon_threadsafe(_break, pool)
            os.unlink(path)
        time.sleep(0.05)


if __name__ == "__main__":
    links.LinkPool.__post_init__ = _track  # type: ignore[method-assign]
    threading.Thread(target=_watch, args=(os.environ["FSD_BREAK_LINK"],), daemon=True).start()
    app()

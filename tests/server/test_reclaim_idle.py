"""Servers' idle connections are reclaimed for a listener out of descriptors."""

from __future__ import annotations

import asyncio
import threading

from fsd.server.listen import add_reclaimer, reclaim_idle


def test_reclaim_counts_its_own_loop_and_asks_other_loops_on_their_thread():
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    asked: list[tuple[str, int, str]] = []
    done = threading.Event()

    def far(n: int) -> tuple[int, bool]:
        asked.append(("far", n, threading.current_thread().name))
        done.set()
        return 5, True

    async def main() -> tuple[int, bool]:
        def near(n: int) -> tuple[int, bool]:
            asked.append(("near", n, threading.current_thread().name))
            return 3, False

        remove_near = add_reclaimer(asyncio.get_running_loop(), near)
        remove_far = add_reclaimer(other, far)
        try:
            return reclaim_idle(4)
        finally:
            remove_near()
            remove_far()

    try:
        assert asyncio.run(main()) == (3, False)  # only what this loop closed counts now
        assert done.wait(5)
        assert ("near", 4, threading.current_thread().name) in asked
        assert ("far", 4, thread.name) in asked  # on its own loop's thread
        asked.clear()

        async def again() -> tuple[int, bool]:
            return reclaim_idle(4)

        assert asyncio.run(again()) == (0, False) and asked == []  # removed: asked no more
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()

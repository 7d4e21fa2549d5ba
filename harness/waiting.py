"""Wait for a condition, never for a length of time: a test that sleeps "long enough" fails on a busy machine.

Every wait is bounded, and a wait that runs out raises :class:`NotReached`, which is both an
``AssertionError`` (a test fails, with what it waited for) and a ``TimeoutError`` (a scenario that
may tolerate it catches that).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class NotReached(AssertionError, TimeoutError):
    """The condition did not hold in time."""


async def until(
    condition: Callable[[], object],
    timeout: float = 5.0,
    *,
    what: str = "condition",
    interval: float = 0.001,
    blocking: bool = False,
) -> float:
    """Let the event loop run until ``condition()`` holds; the seconds it took.

    ``blocking``: the condition blocks (an HTTP call to another process), so it runs in a thread
    and the loop keeps serving meanwhile."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not (await asyncio.to_thread(condition) if blocking else condition()):
        if loop.time() - start > timeout:
            raise NotReached(f"{what}: not reached within {timeout:g}s")
        await asyncio.sleep(interval)
    return loop.time() - start


def wait_until(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, *, what: str = "condition"
) -> float:
    """``until`` outside an event loop (processes, sockets): poll ``condition()``; the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise NotReached(f"{what}: not reached within {timeout:g}s")
        time.sleep(interval)
    return time.monotonic() - start

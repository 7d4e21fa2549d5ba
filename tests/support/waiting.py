"""Wait for a condition, never for a length of time: a test that sleeps "long enough" fails on a busy machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Let the event loop run until ``condition()`` holds; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def wait_until(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> None:
    """``until`` for tests outside an event loop (processes, sockets): poll ``condition()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)

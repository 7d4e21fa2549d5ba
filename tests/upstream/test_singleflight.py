import asyncio

import pytest

from harness.waiting import until
from watchcache.backoff import Backoff
from watchcache.dispatch.freshness import NoTarget
from watchcache.upstream.consistency import _SingleFlight


class Fetches:
    """A fetch the test completes by hand: ``release(i, value)`` ends the i-th (from 1)."""

    def __init__(self) -> None:
        self.started: list[asyncio.Future[int]] = []
        self.changed = asyncio.Event()

    async def __call__(self) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.started.append(fut)
        self.changed.set()
        return await fut

    async def wait_started(self, n: int) -> None:
        while len(self.started) < n:
            self.changed.clear()
            await self.changed.wait()


def test_a_caller_never_gets_an_rv_read_before_it_arrived():
    async def go():
        calls = []
        release = {1: asyncio.Event(), 2: asyncio.Event()}

        async def fetch():
            calls.append(len(calls) + 1)
            n = len(calls)
            await release[n].wait()
            return n

        flight = _SingleFlight(fetch)
        first = asyncio.ensure_future(flight.get())
        await until(lambda: calls == [1])  # the first fetch is in flight
        late = [asyncio.ensure_future(flight.get()) for _ in range(5)]
        await asyncio.sleep(0)  # one loop pass: each late caller has asked (tasks run in creation order)
        release[1].set()
        await until(lambda: calls == [1, 2])
        release[2].set()
        results = await asyncio.gather(first, *late)
        return results, calls

    results, calls = asyncio.run(go())
    assert results[0] == 1
    # the five late callers share ONE second fetch, started after they arrived
    assert results[1:] == [2] * 5
    assert calls == [1, 2]


def test_after_a_failure_callers_fail_at_once_until_the_backoff_has_passed():
    async def go():
        fetches = Fetches()
        flight = _SingleFlight(fetches, Backoff(0.2, 0.2))
        first = asyncio.ensure_future(flight.get())
        await fetches.wait_started(1)
        joined = asyncio.ensure_future(flight.get())  # arrived during the failing fetch
        await asyncio.sleep(0)
        fetches.started[0].set_exception(OSError("connection refused"))
        for caller in (first, joined):
            with pytest.raises(NoTarget):
                await caller
        with pytest.raises(NoTarget, match="backing off"):
            await flight.get()  # no new fetch while backing off
        assert len(fetches.started) == 1
        await asyncio.sleep(0.25)
        again = asyncio.ensure_future(flight.get())
        await fetches.wait_started(2)
        fetches.started[1].set_result(7)
        return await again, dict(flight.fetches)

    value, counts = asyncio.run(go())
    assert value == 7
    assert counts == {"failed": 1, "ok": 1}

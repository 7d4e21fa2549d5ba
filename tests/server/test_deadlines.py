"""Request deadlines on one timer (``server/deadlines.py``): asyncio.timeout's behaviour, on real loops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from watchcache.server.deadlines import Deadline, Deadlines

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    def go(coro: Coroutine[Any, Any, Any]) -> Any:
        loop = LOOPS[request.param]()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()

    return go


async def sleeper(deadlines: Deadlines, seconds: float, log: list[str], name: str) -> Deadline:
    deadline = deadlines.new()
    try:
        async with deadline:
            await asyncio.sleep(seconds)
        log.append(f"{name} done")
    except TimeoutError:
        log.append(f"{name} timed out")
    return deadline


def test_a_request_past_its_deadline_times_out_and_one_within_it_does_not(run: Callable[..., Any]) -> None:
    async def go() -> tuple[list[str], list[bool], int]:
        deadlines = Deadlines(0.2)
        log: list[str] = []
        slow = asyncio.ensure_future(sleeper(deadlines, 5, log, "slow"))
        await asyncio.sleep(0.05)
        quick = await sleeper(deadlines, 0.01, log, "quick")  # began after slow, ended before its deadline
        late = asyncio.ensure_future(sleeper(deadlines, 0.3, log, "late"))  # begins 0.06 s after slow
        started = asyncio.get_running_loop().time()
        slow_deadline = await slow
        elapsed = asyncio.get_running_loop().time() - started
        assert 0.1 <= elapsed < 0.4, elapsed  # at slow's own deadline, not at a later one
        late_deadline = await late
        return log, [d.expired() for d in (slow_deadline, quick, late_deadline)], len(deadlines)

    log, expired, active = run(go())
    assert log == ["quick done", "slow timed out", "late timed out"]
    assert expired == [True, False, True]
    assert active == 0  # nothing kept once every request ended


def test_a_lifted_deadline_never_expires(run: Callable[..., Any]) -> None:
    async def go() -> tuple[bool, int]:
        deadlines = Deadlines(0.05)
        deadline = deadlines.new()
        async with deadline:
            deadline.reschedule(None)  # a watch: long-running from here
            assert len(deadlines) == 0
            await asyncio.sleep(0.15)
        return deadline.expired(), len(deadlines)

    assert run(go()) == (False, 0)


def test_no_deadline_when_disabled_or_without_a_timeout(run: Callable[..., Any]) -> None:
    async def go() -> list[bool]:
        out = []
        for deadline in (Deadlines(None).new(), Deadlines(0.01).new(enabled=False)):
            async with deadline:
                await asyncio.sleep(0.05)
            out.append(deadline.expired())
        return out

    assert run(go()) == [False, False]


def test_a_cancellation_from_elsewhere_stays_a_cancellation(run: Callable[..., Any]) -> None:
    async def go() -> str:
        deadlines = Deadlines(10)

        async def work() -> None:
            async with deadlines.new():
                await asyncio.sleep(5)

        task = asyncio.ensure_future(work())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return f"cancelled, {len(deadlines)} in force"
        return "not cancelled"

    assert run(go()) == "cancelled, 0 in force"


def test_many_sequential_requests_keep_one_timer_and_nothing_behind(run: Callable[..., Any]) -> None:
    async def go() -> tuple[int, int]:
        deadlines = Deadlines(0.05)
        loop = asyncio.get_running_loop()
        timers = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += callback == deadlines._fire  # (asyncio's own sleep goes through call_at too)
            return call_at(when, callback, *args, **kw)

        loop.call_at = counting  # type: ignore[method-assign]
        for _ in range(1000):
            async with deadlines.new():
                await asyncio.sleep(0)
        await asyncio.sleep(0.1)  # the timer fires, finds nothing in force, and is not re-armed
        async with deadlines.new():
            pass
        return timers, len(deadlines)

    timers, active = run(go())
    assert timers == 2 and active == 0


def test_a_deadline_is_entered_once() -> None:
    async def go() -> None:
        deadline = Deadlines(1).new()
        async with deadline:
            pass
        with pytest.raises(RuntimeError):
            async with deadline:
                pass

    asyncio.run(go())

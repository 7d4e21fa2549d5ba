import asyncio

import pytest

from harness.waiting import until
from watchcache import apierrors
from watchcache.http.request import Request
from watchcache.sim.faults import FaultInjector
from watchcache.watchers.flush import FlushScheduler


def request(path: str = "/api/v1/pods") -> Request:
    return Request("GET", path.encode(), path, {}, {}, b"", "1.1", "t")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_error_fault_answers_every_api_request_until_it_expires():
    async def go():
        clock = Clock()
        f = FaultInjector(FlushScheduler(asyncio.get_running_loop()), clock)
        f.apply(b'{"kind": "error", "seconds": 5, "code": 429}')
        err = f.error_for(request())
        assert isinstance(err, apierrors.StatusError) and err.code == 429 and err.retry_after == 1
        assert f.error_for(request("/sim/faults")) is None and f.error_for(request("/readyz")) is None
        clock.now += 5.1
        assert f.error_for(request()) is None

    asyncio.run(go())


def test_stall_holds_flushes_and_releases_them_when_it_ends():
    async def go():
        clock = Clock()
        flusher = FlushScheduler(asyncio.get_running_loop())
        flushed = []

        class Stream:
            def flush(self) -> None:
                flushed.append(1)

        f = FaultInjector(flusher, clock)
        f.apply(b'{"kind": "stall", "seconds": 2}')
        flusher.mark(Stream())
        await asyncio.sleep(0)  # a loop pass: an unpaused flusher would have flushed now
        assert flushed == [] and not flusher.idle
        f.tick()
        assert flushed == []
        clock.now += 2.5
        f.tick()
        await until(lambda: flusher.idle)
        assert flushed == [1]

    asyncio.run(go())


@pytest.mark.parametrize("body", [b"", b"{}", b'{"kind": "nope"}', b'{"kind": "error", "code": 418}'])
def test_bad_fault_specs_are_400(body):
    async def go():
        f = FaultInjector(FlushScheduler(asyncio.get_running_loop()), Clock())
        with pytest.raises(apierrors.StatusError) as e:
            f.apply(body)
        assert e.value.code == 400

    asyncio.run(go())

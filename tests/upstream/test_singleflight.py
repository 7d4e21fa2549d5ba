import asyncio

from tests.waiting import until
from watchcache.upstream.consistency import _SingleFlight


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

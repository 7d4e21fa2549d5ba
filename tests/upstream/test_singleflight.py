import asyncio

from watchcache.upstream.consistency import _SingleFlight


def test_a_caller_never_gets_an_rv_read_before_it_arrived():
    async def go():
        calls = []

        async def fetch():
            calls.append(len(calls) + 1)
            n = len(calls)
            await asyncio.sleep(0.02)
            return n

        flight = _SingleFlight(fetch)
        first = asyncio.ensure_future(flight.get())
        await asyncio.sleep(0.005)  # first fetch in flight
        late = [asyncio.ensure_future(flight.get()) for _ in range(5)]
        results = await asyncio.gather(first, *late)
        return results, calls

    results, calls = asyncio.run(go())
    assert results[0] == 1
    # the five late callers share ONE second fetch, started after they arrived
    assert results[1:] == [2] * 5
    assert calls == [1, 2]

"""What counts toward --max-requests-inflight and --max-watchers (kube-apiserver's long-running rule).

Only a real watch (a GET with ``watch``, or the ``/watch/`` prefix) is long-running, as kube's
``LongRunningRequestCheck`` says; ``?watch=1`` on a POST or on a subresource is an ordinary
request. A watch that still waits for its resourceVersion is not a watcher yet: it holds an
in-flight slot until it is registered (as kube's priority-and-fairness holds a watch's seat
until the watch is initialised). A watch passed through counts toward --max-watchers.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlencode

from harness.waiting import until
from tests.support.factories import FakeResponse
from tests.support.handlers import MODIFIED, Harness, arun
from watchcache import apierrors
from watchcache.http.request import Request

PODS = "/api/v1/namespaces/default/pods"


def start(h: Harness, path: str, query: dict[str, Any], method: str = "GET") -> tuple[asyncio.Task[None], FakeResponse]:
    """A request in the background; its response records what it got (errors as Status)."""
    qs = urlencode(query)
    req = Request(method, (path + "?" + qs).encode(), path, parse_qs(qs), {}, b"", "1.1", "test")
    resp = FakeResponse()

    async def run() -> None:
        try:
            await h.handler(req, resp)
        except apierrors.StatusError as e:
            resp.send(e.code, e.body())

    return asyncio.ensure_future(run()), resp


async def finish(task: asyncio.Task[None], resp: FakeResponse) -> None:
    if not task.done():
        resp.disconnect()
    await asyncio.wait_for(task, 3)


@arun
async def test_a_watch_waiting_for_its_rv_holds_no_seat_while_it_waits() -> None:
    h = Harness(fresh_wait=3.0, max_requests_inflight=1)
    watch = start(h, PODS, {"watch": "1", "resourceVersion": "12"})
    await until(lambda: h.cacher.waiting == 1)
    assert h.handler.active == 0 and h.handler.seats.waiting == 1
    assert (await h.list()).status == 200, "a waiting watch kept the only in-flight seat"
    h.write(MODIFIED, "p1")
    h.write(MODIFIED, "p2")  # rv 12: the watch starts
    await until(lambda: len(h.cacher.dispatcher) == 1)
    assert h.handler.seats.waiting == 0
    await finish(*watch)
    assert h.handler.active == 0


@arun
async def test_a_watch_waiting_when_too_many_wait_holds_its_seat_until_it_is_a_watcher() -> None:
    h = Harness(fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0)
    watch = start(h, PODS, {"watch": "1", "resourceVersion": "12"})
    await until(lambda: h.cacher.waiting == 1)
    res = await h.list()
    assert res.status == 429, "a LIST got in while a waiting watch held the only in-flight slot"
    h.write(MODIFIED, "p1")
    h.write(MODIFIED, "p2")  # rv 12: the watch starts, and gives its slot back
    await until(lambda: len(h.cacher.dispatcher) == 1)
    assert (await h.list()).status == 200
    await finish(*watch)
    assert h.handler.active == 0


@arun
async def test_watch_param_on_a_post_or_a_subresource_is_not_long_running() -> None:
    h = Harness(fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0)
    waiting = start(h, PODS, {"resourceVersion": "20"})  # a LIST waiting for rv 20 holds the slot (no room to wait)
    await until(lambda: h.cacher.waiting == 1)
    for method, path in (("POST", PODS), ("GET", PODS + "/p0/log"), ("DELETE", PODS + "/p0")):
        res = await h.request(path, {"watch": "1"}, method=method)
        assert res.status == 429, f"{method} {path}?watch=1 skipped the in-flight limit: {res.status}"
    assert h.upstream.forwarded == []
    h.cacher.progress(20)
    await finish(*waiting)
    assert waiting[1].status == 200


@arun
async def test_registered_watches_hold_no_inflight_slot() -> None:
    h = Harness(max_requests_inflight=1)
    watches = [start(h, PODS, {"watch": "1", "resourceVersion": "10"}) for _ in range(3)]
    await until(lambda: len(h.cacher.dispatcher) == 3)
    assert h.handler.active == 0
    assert (await h.list()).status == 200
    for w in watches:
        await finish(*w)


@arun
async def test_a_watch_passed_through_counts_toward_max_watchers_not_inflight() -> None:
    h = Harness(max_requests_inflight=1, max_watchers=1)
    h.upstream.hold = asyncio.Event()
    passed = start(h, "/api/v1/namespaces/default/configmaps", {"watch": "1"})  # not cached: forwarded
    await until(lambda: h.upstream.forwarded != [])
    assert h.handler.active == 0
    assert (await h.list()).status == 200
    second = start(h, PODS, {"watch": "1", "resourceVersion": "10"})
    await until(lambda: second[1].status is not None)
    assert second[1].status == 429, "a second watch got in while a passed-through one was open"
    assert "too many watches" in second[1].json()["message"]
    await finish(*second)
    h.upstream.hold.set()
    await finish(*passed)
    assert h.handler.streams == 0

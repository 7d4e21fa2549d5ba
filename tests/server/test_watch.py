"""Watch behaviour beyond the table: transitions, bookmarks, streaming lists, errors."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

import pytest

from tests.support.factories import FakeResponse
from tests.support.handlers import MODIFIED, Harness, arun, background, until
from watchcache.http.request import Request
from watchcache.watchers.budget import WatchBudget


@pytest.fixture(autouse=True, params=["attached", "detached"])
def _answered(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every watch test as over HTTP/2 (the handler waits for the watch's end) and as over HTTP/1.1
    (the handler returns once the watch is registered, which goes on without it)."""
    monkeypatch.setattr(Harness, "detached", request.param == "detached")


@arun
async def test_object_leaving_the_selection_arrives_as_deleted_with_previous_state_and_event_rv():
    h = Harness()

    def writes() -> None:
        h.write(MODIFIED, "p1", labels={"i": "0"})  # 11: leaves i=1
        h.write(MODIFIED, "p2", labels={"i": "1"})  # 12: enters i=1
        h.write(MODIFIED, "p2", labels={"i": "1", "x": "y"})  # 13: stays

    resp = await h.watch(writes, resourceVersion="10", labelSelector="i=1")
    got = [
        (
            e["type"],
            e["object"]["metadata"]["name"],
            e["object"]["metadata"]["resourceVersion"],
            e["object"]["metadata"]["labels"],
        )
        for e in resp.events()
    ]
    assert got == [
        ("DELETED", "p1", "11", {"i": "1"}),
        ("ADDED", "p2", "12", {"i": "1"}),
        ("MODIFIED", "p2", "13", {"i": "1", "x": "y"}),
    ]


@arun
async def test_watch_from_rv_before_window_gets_410_expired_error_event():
    h = Harness(max_events=2)
    for _ in range(3):
        h.write(MODIFIED, "p1", labels={"i": "1"})
    resp = await h.watch(resourceVersion="10")
    assert resp.status == 200
    [event] = resp.events()
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"] == "too old resource version: 10 (11)"


@arun
async def test_send_initial_events_ends_with_annotated_bookmark_then_streams():
    h = Harness()
    resp = await h.watch(
        lambda: h.write(MODIFIED, "p1", labels={"i": "1"}),
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        labelSelector="i=1",
    )
    events = resp.events()
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK", "MODIFIED"]
    bookmark = events[2]["object"]
    assert bookmark["metadata"] == {"resourceVersion": "10", "annotations": {"k8s.io/initial-events-end": "true"}}
    assert bookmark["kind"] == "Pod" and bookmark["apiVersion"] == "v1"


@arun
async def test_send_initial_events_waits_for_not_older_than_rv_else_error_event_504():
    h = Harness(fresh_wait=0.05)
    resp = await h.watch(
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        resourceVersion="20",
    )
    [event] = resp.events()
    assert event["type"] == "ERROR" and event["object"]["code"] == 504


@arun
async def test_send_initial_events_without_not_older_than_is_422():
    h = Harness()
    resp = await h.watch(sendInitialEvents="true")
    assert resp.status == 422
    assert "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan" in resp.json()["message"]


@arun
async def test_periodic_bookmarks_carry_the_cache_rv_and_the_kinds_zero_values():
    h = Harness(bookmark_interval=0.0)

    def tick() -> None:
        h.cacher.progress(15)
        h.cacher.tick()

    resp = await h.watch(tick, resourceVersion="10", allowWatchBookmarks="true")
    events = resp.events()
    assert events == [
        {
            "type": "BOOKMARK",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": "15"},
                "spec": {"containers": None},  # a Pod's zero values, as kube's bookmark (cache/zeros.py)
                "status": {},
            },
        }
    ]


@arun
async def test_no_bookmarks_unless_allowed():
    h = Harness(bookmark_interval=0.0)

    def tick() -> None:
        h.cacher.progress(15)
        h.cacher.tick()

    resp = await h.watch(tick, resourceVersion="10")
    assert resp.events() == []


@arun
async def test_watch_with_future_rv_waits_silently_and_starts_after_it():
    h = Harness()
    watch = await h.start_watch(resourceVersion="12").in_flight()
    assert not watch.registered and not watch.task.done()  # waiting for rv 12, silently
    h.write(MODIFIED, "p1")  # 11 (not delivered: <= 12)
    h.write(MODIFIED, "p2")  # 12
    await watch.started()
    h.write(MODIFIED, "p3")  # 13
    resp = await watch.close()
    assert [e["object"]["metadata"]["resourceVersion"] for e in resp.events()] == ["13"]


@arun
async def test_bad_label_selector_is_400_before_streaming():
    h = Harness()
    resp = await h.watch(labelSelector="a in (b")
    assert resp.status == 400 and resp.json()["reason"] == "BadRequest"
    resp = await h.watch(fieldSelector="spec.bogus=1")
    assert resp.status == 400 and resp.json()["message"] == "field label not supported: spec.bogus"


@arun
async def test_watch_timeout_seconds_ends_the_stream_cleanly():
    h = Harness()
    watch = await h.open_watch(resourceVersion="10", timeoutSeconds="1")
    resp = await watch.ended(timeout=5.0)
    assert resp.ended and not resp.closed


@arun
async def test_disconnected_watcher_is_removed_from_dispatch():
    h = Harness()
    watch = await h.open_watch(resourceVersion="10")
    assert len(h.cacher.dispatcher) == 1
    await watch.close()
    await until(lambda: len(h.cacher.dispatcher) == 0)


@arun
async def test_events_are_coalesced_into_one_chunk_per_loop_pass():
    h = Harness()

    def burst() -> None:
        for i in range(50):
            h.write(MODIFIED, f"p{i % 5}")

    resp = await h.watch(burst, resourceVersion="10")
    assert len(resp.events()) == 50
    assert len(resp.chunks) == 1


@arun
async def test_a_watch_whose_flush_raises_is_ended_alone_and_counted():
    h = Harness()

    class Broken(FakeResponse):
        def write_chunk(self, parts):  # type: ignore[no-untyped-def]
            raise RuntimeError("a bug on this watch's write path")

    broken = Broken(outlives_handler=Harness.detached)
    # The broken watch registers first, so its flush runs first in each pass.
    first = await h.open_watch(broken, resourceVersion="10")
    healthy = await h.open_watch(resourceVersion="10")
    h.write(MODIFIED, "p1")
    await until(lambda: h.ctx.flusher.idle)  # one flush pass: the broken watch's raises
    h.write(MODIFIED, "p2")
    await first.close()
    resp = await healthy.close()
    assert [e["object"]["metadata"]["name"] for e in resp.events()] == ["p1", "p2"]
    assert broken.closed  # the connection was dropped: the client resumes from what it read
    assert h.cacher.failures == {"flush": 1}
    assert h.ctx.flusher.failures == 1


@arun
async def test_many_watchers_whose_clients_do_not_read_stay_within_the_budget_then_catch_up_without_gaps():
    h = Harness(max_events=10_000)
    budget = h.ctx.watch_budget = WatchBudget(64_000, h.ctx.flusher)
    qs = "watch=true&resourceVersion=10"
    path = "/api/v1/namespaces/default/pods"
    stalled = [FakeResponse(outlives_handler=Harness.detached) for _ in range(50)]
    for resp in stalled:
        resp.writable = False  # a client that does not read
    reader = FakeResponse(outlives_handler=Harness.detached)
    tasks = [
        background(h.handler(Request("GET", f"{path}?{qs}".encode(), path, parse_qs(qs), {}, b"", "1.1", "t"), resp))
        for resp in [*stalled, reader]
    ]
    await until(lambda: len(h.cacher.dispatcher) == 51)
    assert len(budget.watchers) == 51
    peak = 0
    for i in range(400):  # ~110 KB per watcher: 5.5 MB unsent over 50 watchers without the budget
        h.write(MODIFIED, f"p{i % 5}")
        await asyncio.sleep(0)  # one loop pass: fan-out, flush, then the budget
        assert budget.pending <= 64_000
        peak = max(peak, sum(w.pending_bytes for w in h.cacher.dispatcher.watchers()))
    # What the watchers really hold: the budget, plus less than a step (and a frame) each uncounted.
    assert peak <= 64_000 + 51 * (budget.step + 400), peak
    assert budget.shed >= 50  # every stalled watcher was sent to catch up from history, most more than once
    assert h.cacher.watchers_lagged == budget.shed  # ... by the budget, not by its own 16 MiB cap
    for resp in stalled:
        resp.writable = True  # the clients read again
    want = list(range(11, 411))
    await until(lambda: all(len(r.events()) >= len(want) for r in stalled))
    for resp in [reader, *stalled]:
        assert [int(e["object"]["metadata"]["resourceVersion"]) for e in resp.events()] == want
    for resp in [reader, *stalled]:
        resp.disconnect()
    await asyncio.gather(*tasks)
    assert budget.pending == 0 and not budget.watchers


@arun
async def test_a_detached_watch_outlives_its_handler_and_its_end_is_the_requests_end():
    """HTTP/1.1: once registered, a watch is its stream and watcher; no handler task waits for it
    (memory per idle watch). Its end still does what the handler's did: the last frames, the end
    of the body, the in-flight count that shutdown waits for."""
    h = Harness()
    resp = FakeResponse(outlives_handler=True)
    watch = await h.open_watch(resp, resourceVersion="10", timeoutSeconds="1")
    await until(lambda: watch.task.done())
    assert watch.task.result() is None  # the handler returned...
    assert len(h.cacher.dispatcher) == 1 and h.handler.inflight == 1  # ... the watch did not
    assert resp.chunked and not resp.ended
    h.write(MODIFIED, "p1")
    await until(lambda: len(resp.events()) == 1)
    await until(lambda: resp.ended, timeout=5.0)  # timeoutSeconds: the body ends cleanly
    await asyncio.sleep(0)
    assert not resp.closed and h.handler.inflight == 0 and len(h.cacher.dispatcher) == 0


@arun
async def test_a_detached_watch_whose_client_goes_ends_its_request():
    h = Harness()
    resp = FakeResponse(outlives_handler=True)
    watch = await h.open_watch(resp, resourceVersion="10")
    await until(lambda: watch.task.done())
    assert h.handler.inflight == 1
    resp.disconnect()
    assert len(h.cacher.dispatcher) == 0  # the watcher left at once
    await until(lambda: h.handler.inflight == 0)
    assert not resp.ended  # nothing written to a client that is gone

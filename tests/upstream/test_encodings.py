"""A JSON feed suspended while only protobuf clients read its resource (upstream/encodings.py), without sockets:
the decision, the cacher's SUSPENDED state, and the feeds' suspend/resume against fake reflectors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.waiting import until
from tests.support.factories import pod
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.dispatch.cacher import Cacher, CacherState, WatchRequest
from watchcache.resources import PODS
from watchcache.upstream.encodings import JsonFeeds, should_suspend
from watchcache.upstream.reflector import Reflector

NOW = 1000.0
IDLE = 300.0


def synced(rv: int = 10, objects: int = 2) -> Cacher:
    cacher = Cacher(PODS, clock=lambda: NOW)
    cacher.replace([pod(f"p{i}", rv=i + 1) for i in range(objects)], rv)
    return cacher


class _Replica:
    def on_events(self, events: Any) -> None: ...
    def on_progress(self, rv: int) -> None: ...
    def on_relist(self, events: Any, rv: int) -> None: ...
    def cut(self, why: str) -> None: ...


class Sink:
    def wake(self, watcher: Any) -> None: ...
    def closed(self, watcher: Any, reason: str) -> None: ...
    def lagging(self, watcher: Any) -> None: ...


def _case(change: str) -> tuple[Cacher, Cacher | None]:
    json, protobuf = synced(), synced()
    json.last_used = NOW - IDLE
    if change == "no protobuf cache":
        return json, None
    if change == "protobuf cache syncing":
        return json, Cacher(PODS)
    if change == "json read within idle":
        json.last_used = NOW - IDLE + 1
    if change == "json watcher":
        plan = WatchPlan(Mode.EXACT, json.rv, initial_events=False, initial_events_end_bookmark=False)
        json.start_watch(WatchRequest(SelectionPredicate.parse(PODS, None, "", ""), plan), Sink())
    if change == "json follower":
        json.replicas.append(_Replica())
    if change == "json syncing":
        json = Cacher(PODS)
        json.last_used = NOW - IDLE
    return json, protobuf


@pytest.mark.parametrize(
    "change, suspend",
    [
        ("none: protobuf serves, json unread for idle", True),
        ("no protobuf cache", False),
        ("protobuf cache syncing", False),
        ("json read within idle", False),
        ("json watcher", False),
        ("json follower", False),
        ("json syncing", False),
    ],
)
def test_should_suspend(change: str, suspend: bool) -> None:
    json, protobuf = _case(change)
    assert should_suspend(json, protobuf, NOW, IDLE) is suspend


def test_a_suspended_cacher_holds_nothing_is_served_and_is_ready_again_after_its_next_list() -> None:
    async def run() -> None:
        cacher = synced(rv=10, objects=3)
        resumed: list[bool] = []
        waiting = asyncio.ensure_future(cacher.wait_for_rv(50, 10.0))
        await asyncio.sleep(0)
        cacher.suspend(lambda: resumed.append(True))
        assert cacher.state is CacherState.SUSPENDED and not cacher.ready and cacher.serving
        assert len(cacher.cache) == 0 and cacher.cache.stats().object_bytes == 0
        assert await waiting is False  # a read waiting for an rv is woken, unsatisfied
        assert cacher.resume is not None
        cacher.resume()
        assert resumed == [True]
        cacher.replace([pod("p0", rv=20)], 20)
        assert cacher.ready and cacher.resume is None and len(cacher.cache) == 1

    asyncio.run(run())


class FakeReflector(Reflector):
    """Lists ``objects`` into its cache (replacing it on a resync), then watches forever."""

    def __init__(self, cacher: Cacher, objects: int = 2) -> None:
        super().__init__(None, cacher)  # type: ignore[arg-type]
        self.objects = objects
        self.runs = 0
        self.fail: Exception | None = None

    async def run(self) -> None:
        self.runs += 1
        if self.fail is not None:
            raise self.fail
        rv = 10 * self.runs
        self.cacher.replace([pod(f"p{i}", rv=rv - i) for i in range(self.objects)], rv)
        await asyncio.Event().wait()


def test_feeds_suspend_resume_on_a_read_and_resume_when_the_protobuf_cache_goes() -> None:
    async def run() -> None:
        clock = [NOW]
        json = Cacher(PODS, clock=lambda: clock[0])
        protobuf: dict[str, Cacher | None] = {"pods": None}
        feeds = JsonFeeds(lambda r: protobuf["pods"], idle=IDLE, clock=lambda: clock[0])
        reflector = FakeReflector(json)
        running = asyncio.ensure_future(feeds.run([reflector]))
        await until(lambda: json.ready)
        clock[0] += IDLE
        feeds.tick()
        assert json.ready  # no protobuf cache: the JSON feed is the resource's only one
        protobuf["pods"] = synced()
        feeds.tick()
        assert json.state is CacherState.SUSPENDED and json not in feeds.tasks and feeds.suspensions == 1
        assert json.ready_wait == feeds.resume_wait  # the read that resumes it waits for the resync
        # A read resumes it once; it is ready at the resync's rv.
        assert json.resume is not None
        json.resume()
        assert json.resume is None and json in feeds.tasks
        await until(lambda: json.ready)
        assert reflector.runs == 2 and json.rv == 20 and feeds.resumptions == 1
        # Suspended again; then its protobuf cache goes: the next tick resumes it, whoever reads.
        clock[0] += IDLE
        feeds.tick()
        assert json.state is CacherState.SUSPENDED
        protobuf["pods"] = None
        feeds.tick()
        await until(lambda: json.ready)
        assert reflector.runs == 3 and feeds.resumptions == 2
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert feeds.tasks == {}

    asyncio.run(run())


def test_a_reflector_that_ends_by_itself_ends_the_feeds_with_its_error() -> None:
    async def run() -> None:
        broken = FakeReflector(Cacher(PODS))
        broken.fail = RuntimeError("a bug")
        healthy = FakeReflector(Cacher(PODS))
        feeds = JsonFeeds(lambda r: None)
        with pytest.raises(RuntimeError, match="a bug"):
            await feeds.run([healthy, broken])
        assert feeds.tasks == {}

    asyncio.run(run())


def test_an_optional_reflector_that_ends_is_forgotten_and_the_feeds_go_on() -> None:
    """An on-demand kind's feed (``add(optional=True)``): its end is logged, not the process's end."""

    async def run() -> None:
        healthy = FakeReflector(Cacher(PODS))
        feeds = JsonFeeds(lambda r: None)
        running = asyncio.ensure_future(feeds.run([healthy]))
        await until(lambda: healthy.cacher.ready)
        broken = FakeReflector(Cacher(PODS))
        broken.fail = RuntimeError("a bug")
        feeds.add(broken, optional=True)
        await until(lambda: broken.cacher not in feeds.reflectors)
        await asyncio.sleep(0.01)
        assert not running.done() and broken.cacher not in feeds.tasks and healthy.cacher in feeds.tasks
        later = FakeReflector(Cacher(PODS))
        feeds.add(later, optional=True)  # still running: later ones start as before
        await until(lambda: later.cacher.ready)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert feeds.tasks == {}

    asyncio.run(run())


def test_a_reflector_added_later_runs_and_a_removed_one_stops_suspended_or_not() -> None:
    async def run() -> None:
        feeds = JsonFeeds(lambda r: synced(), idle=IDLE, clock=lambda: NOW + IDLE)
        first, later = (FakeReflector(Cacher(PODS, clock=lambda: NOW)) for _ in range(2))
        running = asyncio.ensure_future(feeds.run([first]))
        await until(lambda: first.cacher.ready)
        feeds.add(later)
        await until(lambda: later.cacher.ready)
        feeds.tick()  # both unread for IDLE, their protobuf cache serves: suspended
        assert first.cacher.state is CacherState.SUSPENDED and later.cacher.state is CacherState.SUSPENDED
        feeds.remove(later.cacher)
        assert later.cacher.resume is not None
        later.cacher.resume()  # a read of a resource no longer cached here: nothing starts
        assert later.cacher not in feeds.tasks and later.runs == 1
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(run())

"""Backfill across workers, over real follow streams on a unix socket, in one process.

An ``Upstream`` model holds every write; the owner's cache started late (a restarted worker:
a list at the upstream's head) and backfills from the model, counting its fetches. Followers
ask the owner for older history, and resume from their own rv when their stream breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import orjson

from harness.doubles import NullSink
from harness.waiting import until
from tests.support.factories import pod
from tests.support.handlers import arun
from watchcache.backoff import Backoff
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, Span
from watchcache.dispatch.backfill import BackfillFailed, Backfills, Fetched, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.shard import convert, owner
from watchcache.shard.follower import Follower
from watchcache.shard.owner import FollowServer
from watchcache.watchers.watcher import Watcher


class Upstream:
    """Every write since rv 1: pods p0..p4 in ns, one write per rv."""

    def __init__(self) -> None:
        self.rv = 1
        self.log: list[tuple[str, CachedObject]] = []
        self.fetches: list[int] = []
        # Set: fetches wait for it (a test holds the upstream until every request has reached the owner).
        self.gate: asyncio.Event | None = None

    def write(self, name: str, value: str, *, delete: bool = False) -> tuple[str, CachedObject]:
        self.rv += 1
        exists = name in self.state(self.rv)
        kind = DELETED if delete else MODIFIED if exists else ADDED
        change = (kind, pod(name, "ns", self.rv, labels={"v": value}))
        self.log.append(change)
        return change

    def state(self, rv: int) -> dict[str, CachedObject]:
        objects: dict[str, CachedObject] = {}
        for kind, obj in self.log:
            if obj.rv > rv:
                break
            if kind == DELETED:
                objects.pop(obj.name, None)
            else:
                objects[obj.name] = obj
        return objects

    def span(self, rv: int) -> Span:
        changes = [(k, o) for k, o in self.log if o.rv > rv]
        return Span.from_list(rv, self.state(rv).values(), changes, self.rv)

    async def fetch(self, cacher: Cacher, rv: int) -> Fetched:
        self.fetches.append(rv)
        await asyncio.sleep(0.01)
        if self.gate is not None:
            await self.gate.wait()
        return Fetched(len(cacher.backfill(self.span(rv))), 0)

    def owner(self) -> Cacher:
        """A worker that (re)started now: its window starts at the upstream's head."""
        cacher = Cacher(PODS, CacheConfig(history_max_events=1000))
        cacher.replace(self.state(self.rv).values(), self.rv)
        cacher.backfills = Backfills(cacher, self.fetch, coalesce=0.1)
        return cacher


class Worker:
    """The owner's side: its cache and its socket."""

    def __init__(self, path: str, cacher: Cacher) -> None:
        self.path = path
        self.cacher = cacher
        self.service = FollowServer(lambda rid: self.cacher if rid == "pods" else None)
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.server = await asyncio.get_running_loop().create_unix_server(self.service.protocol, self.path)

    def kill(self) -> None:
        """SIGKILL, as far as its followers can tell: the socket and every stream gone at once."""
        assert self.server is not None
        self.server.close()
        for feed in list(self.cacher.replicas):
            feed.cut("killed")  # type: ignore[attr-defined]
        self.cacher.stop()


def follower_of(path: str, me: int) -> tuple[Follower, Cacher, asyncio.Task[None]]:
    cacher = Cacher(PODS, CacheConfig(history_max_events=1000))
    follower = Follower(PODS, cacher, path, me, resume=True)
    cacher.backfills = Backfills(cacher, follower.fetch, coalesce=0.05, backoff=Backoff(0.05, 0.2))
    return follower, cacher, asyncio.ensure_future(follower.run())


def view(events: list) -> list[tuple[int, str, str, int | None]]:
    return [(e.rv, e.type, e.object.key, None if e.prev is None else e.prev.rv) for e in events]


def frames(watcher: Watcher) -> list[tuple[str, str, int]]:
    out = []
    for line in b"".join(watcher.pending).splitlines():
        event = orjson.loads(line)
        meta = event["object"]["metadata"]
        out.append((event["type"], meta.get("name", ""), int(meta["resourceVersion"])))
    return out


def watch_all(cacher: Cacher) -> Watcher:
    watcher = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), cacher.rv, NullSink())
    cacher.add_watcher(watcher)
    return watcher


@arun
async def test_followers_ask_the_owner_and_the_owner_fetches_once_for_everyone(tmp_path: Path) -> None:
    up = Upstream()
    for i in range(20):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())  # restarted at rv 21: clients hold older rvs
    for i in range(5):
        worker.cacher.apply([up.write(f"p{i}", "after")])
    await worker.start()
    followers = [follower_of(worker.path, me) for me in (1, 2)]
    try:
        await until(lambda: all(c.ready for _, c, _ in followers))
        assert [c.cache.oldest_rv for _, c, _ in followers] == [21, 21]
        asks = [(followers[0][1], 8), (followers[1][1], 5), (worker.cacher, 12), (followers[0][1], 15)]
        # The upstream answers once all three reach the owner (its own 12, follower 1's 8 — its 15
        # shares that fetch — and follower 2's 5): how soon they arrive must not decide the count.
        up.gate = asyncio.Event()
        pending = asyncio.gather(*(reach_back(cacher, rv, 5.0) for cacher, rv in asks))
        owners = worker.cacher.backfills
        assert owners is not None
        await until(lambda: owners.waiting == 3)
        up.gate.set()
        results = await pending
        assert results == [None] * 4
        assert len(up.fetches) <= 2 and min(up.fetches) == 5, up.fetches  # the single flight is the owner's
        for cacher, rv in asks:
            assert view(cacher.cache.events_since(rv)) == view(worker.cacher.cache.events_since(rv))
            assert {o.key: o.rv for o in cacher.cache.snapshot(rv).iter_range("", None)} == {
                f"ns/{n}": o.rv for n, o in up.state(rv).items()
            }
        # The followers keep following: their windows now reach back, live changes still arrive.
        worker.cacher.apply([up.write("p1", "live")])
        await until(lambda: all(c.rv == up.rv for _, c, _ in followers))
    finally:
        for _, _, task in followers:
            task.cancel()
        worker.kill()


@arun
async def test_a_follower_whose_owner_is_killed_keeps_its_watchers_and_resumes_from_its_rv(tmp_path: Path) -> None:
    up = Upstream()
    for i in range(10):
        up.write(f"p{i % 5}", str(i))
    path = str(tmp_path / "w0.sock")
    worker = Worker(path, up.owner())
    await worker.start()
    follower, cacher, task = follower_of(path, 1)
    try:
        await until(lambda: cacher.ready)
        worker.cacher.apply([up.write("p0", "seen")])
        await until(lambda: cacher.rv == up.rv)
        watcher = watch_all(cacher)
        held = cacher.rv
        worker.kill()
        missed = [up.write(f"p{i % 5}", f"missed{i}") for i in range(8)]  # while the owner is down
        missed.append(up.write("p2", "gone", delete=True))
        restarted = Worker(path, up.owner())  # the supervisor's new worker lists at the head
        await restarted.start()
        await until(lambda: cacher.rv == up.rv and follower.resumes == 1, timeout=10)
        restarted.cacher.apply([up.write("p3", "live")])
        await until(lambda: cacher.rv == up.rv)
        # Every update exactly once, in order, with its own rv: no difference, no relist, no 410.
        expected = [(k, o.name, o.rv) for k, o in missed] + [(MODIFIED, "p3", up.rv)]
        assert frames(watcher) == expected
        assert not watcher.closed and follower.resyncs == 0
        assert up.fetches == [held]  # the new owner backfilled from the follower's rv
        assert cacher.cache.oldest_rv < held  # the follower's own window is kept
        assert view(cacher.cache.events_since(held)) == view(restarted.cacher.cache.events_since(held))
        restarted.kill()
    finally:
        task.cancel()


@arun
async def test_a_follower_whose_owner_relisted_meanwhile_gets_a_snapshot_as_before(tmp_path: Path) -> None:
    up = Upstream()
    for i in range(6):
        up.write(f"p{i % 5}", str(i))
    path = str(tmp_path / "w0.sock")
    worker = Worker(path, up.owner())
    await worker.start()
    follower, cacher, task = follower_of(path, 1)
    try:
        await until(lambda: cacher.ready)
        watcher = watch_all(cacher)
        worker.kill()
        new_owner = up.owner()
        for i in range(3):
            up.write(f"p{i}", f"unseen{i}")
        new_owner.relist(up.state(up.rv).values(), up.rv)  # its upstream answered 410: history lost
        restarted = Worker(path, new_owner)
        await restarted.start()
        await until(lambda: cacher.rv == up.rv and follower.resyncs == 1, timeout=10)
        assert follower.resumes == 0 and not watcher.closed
        assert {o.key: o.rv for o in cacher.cache.snapshot().iter_range("", None)} == {
            f"ns/{n}": o.rv for n, o in up.state(up.rv).items()
        }
        restarted.kill()
    finally:
        task.cancel()


@arun
async def test_an_rv_the_upstream_compacted_is_the_followers_410_too(tmp_path: Path) -> None:
    up = Upstream()
    for i in range(6):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())

    async def compacted(cacher: Cacher, rv: int) -> Fetched:
        raise BackfillFailed(BackfillFailed.GONE, f"the upstream answered 410: too old resource version: {rv}")

    worker.cacher.backfills = Backfills(worker.cacher, compacted, coalesce=0.0)
    await worker.start()
    _, cacher, task = follower_of(worker.path, 1)
    try:
        await until(lambda: cacher.ready)
        failed = await reach_back(cacher, 3, 5.0)
        assert failed is not None and failed.outcome == BackfillFailed.GONE and "410" in str(failed)
        assert cacher.cache.oldest_rv == worker.cacher.cache.oldest_rv
    finally:
        task.cancel()
        worker.kill()


@arun
async def test_an_owner_that_cannot_reach_the_upstream_is_asked_once_and_its_429_is_the_followers(
    tmp_path: Path,
) -> None:
    """The owner answers "unreachable" after its own attempts: the follower does not ask again (each ask
    would repeat them behind the owner's growing backoff), so its client hears the 429 as soon as the
    owner's do, not at the end of its wait."""
    up = Upstream()
    for i in range(6):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())
    asked: list[int] = []

    async def down(cacher: Cacher, rv: int) -> Fetched:
        asked.append(rv)
        raise BackfillFailed(BackfillFailed.UNREACHABLE, "ConnectionRefusedError: the upstream is down")

    worker.cacher.backfills = Backfills(worker.cacher, down, coalesce=0.0, backoff=Backoff(0.01, 0.01))
    await worker.start()
    _, cacher, task = follower_of(worker.path, 1)
    try:
        await until(lambda: cacher.ready)
        failed = await reach_back(cacher, 3, 30.0)
        assert failed is not None and failed.outcome == BackfillFailed.UNREACHABLE, failed
        assert "the upstream is down" in str(failed)
        assert cacher.backfills is not None and cacher.backfills.fetches == {"unreachable": 1}  # one ask
        assert asked == [3, 3, 3]  # the owner's three attempts, once
    finally:
        task.cancel()
        worker.kill()


class FailingSpans:
    """``owner.span_to_pb`` that raises its first ``failures`` calls (a bug in answering a backfill)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.real = convert.span_to_pb

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("a bug")
        return self.real(*args)


@arun
async def test_a_backfill_answer_that_raises_cuts_only_that_follower(tmp_path: Path, monkeypatch) -> None:
    up = Upstream()
    for i in range(6):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())
    await worker.start()
    (f1, c1, t1), (f2, c2, t2) = follower_of(worker.path, 1), follower_of(worker.path, 2)
    try:
        await until(lambda: c1.ready and c2.ready)
        local = watch_all(worker.cacher)
        remote = watch_all(c2)
        # The fault disarms itself: the test never races the follower to undo it (it once waited for
        # ``resumes == 1`` and undid it then, while the follower had already re-asked and been cut again).
        spans = FailingSpans(1)
        monkeypatch.setattr(owner, "span_to_pb", spans)
        assert await reach_back(c1, 3, 5.0) is None  # asked again, after a backoff, on the next stream
        assert spans.calls == 2 and f1.resumes == 1  # its stream was cut once; it resumed from its rv
        assert c1.backfills is not None and c1.backfills.fetches == {"unreachable": 1, "ok": 1}
        worker.cacher.apply([up.write("p4", "after")])
        await until(lambda: c2.rv == up.rv and c1.rv == up.rv)
        assert frames(local) == frames(remote) == [(MODIFIED, "p4", up.rv)]
        assert f2.resumes == 0 and f2.resyncs == 0
    finally:
        for task in (t1, t2):
            task.cancel()
        worker.kill()


@arun
async def test_an_owner_whose_backfill_answer_always_raises_is_asked_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch
) -> None:
    up = Upstream()
    for i in range(6):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())
    await worker.start()
    f1, c1, t1 = follower_of(worker.path, 1)
    try:
        await until(lambda: c1.ready)
        spans = FailingSpans(1_000_000)
        monkeypatch.setattr(owner, "span_to_pb", spans)
        failed = await reach_back(c1, 3, 5.0)
        # Each stream cut fails one fetch; the follower's Backfills tries --attempts times with its
        # backoff, then says why: no re-ask loop (it was 970 cut streams in 5 s), no wait to the deadline.
        # (The owner could not answer: the client is told to retry, 429, for --backfill-unreachable-for.)
        assert failed is not None and failed.outcome == BackfillFailed.UNREACHABLE, failed
        assert "stream ended before the owner answered" in str(failed)
        assert c1.backfills is not None and c1.backfills.fetches == {"unreachable": 3}
        assert spans.calls == 3
        monkeypatch.setattr(owner, "span_to_pb", spans.real)
        await until(lambda: f1.resumes == 3 and f1.live.is_set())  # it follows on from its rv
        assert f1.resyncs == 0
    finally:
        t1.cancel()
        worker.kill()

"""Owner → follower replication over a real follow stream on a unix socket, in one process."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from harness.doubles import NullSink
from harness.waiting import until
from tests.support.factories import pod
from tests.support.handlers import arun
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.object import CachedObject, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceVersionTooOld
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.shard import follow_pb2 as pb
from watchcache.shard import owner
from watchcache.shard.follower import Follower
from watchcache.shard.framing import FrameDecoder, encode_frame
from watchcache.shard.owner import FollowServer, ReplicaFeed
from watchcache.watchers.watcher import Watcher


def state(cacher: Cacher, rv: int | None = None) -> dict[str, bytes]:
    return {o.key: o.body for o in cacher.cache.snapshot(rv).iter_range("", None)}


class Pair:
    def __init__(self, tmp: Path, max_buffer: int = owner.MAX_BUFFER) -> None:
        self.sock = str(tmp / "w0.sock")
        self.owner = Cacher(PODS, CacheConfig(history_max_events=50))
        self.owner.replace([pod(f"p{i}", rv=i + 1) for i in range(5)], 10)
        self.rv = 10
        self.service = FollowServer(lambda rid: self.owner if rid == "pods" else None, max_buffer=max_buffer)
        self.follower_cacher = Cacher(PODS)
        self.follower = Follower(PODS, self.follower_cacher, self.sock, me=1)

    async def start(self) -> None:
        self.server = await asyncio.get_running_loop().create_unix_server(self.service.protocol, self.sock)
        self.task = asyncio.ensure_future(self.follower.run())

    async def stop(self) -> None:
        self.task.cancel()
        self.server.close()

    def write(self, kind: str, name: str, **kw) -> int:
        self.rv += 1
        self.owner.apply([(kind, pod(name, rv=self.rv, **kw))])
        return self.rv


@arun
async def test_follower_gets_the_owners_whole_window_and_follows_live(tmp_path):
    p = Pair(tmp_path)
    p.write(MODIFIED, "p1", labels={"v": "1"})  # 11: history before the follower exists
    p.write(DELETED, "p2")  # 12
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        assert p.follower_cacher.cache.oldest_rv == p.owner.cache.oldest_rv == 10
        for rv in (10, 11, 12):  # exact reads anywhere in the window agree
            assert state(p.follower_cacher, rv) == state(p.owner, rv)
        p.write(MODIFIED, "p3", labels={"v": "2"})
        p.owner.progress(20)
        await until(lambda: p.follower_cacher.rv == 20)
        assert state(p.follower_cacher) == state(p.owner)
        # a watch resumed on the follower from an old rv replays the same events as on the owner
        assert [(e.type, e.object.key, e.rv) for e in p.follower_cacher.cache.events_since(10)] == [
            (e.type, e.object.key, e.rv) for e in p.owner.cache.events_since(10)
        ]
    finally:
        await p.stop()


@arun
async def test_owner_relist_reaches_follower_watchers_as_a_diff(tmp_path):
    p = Pair(tmp_path)
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), p.follower_cacher.rv, NullSink())
        p.follower_cacher.add_watcher(w)
        p.owner.relist([pod("p0", rv=1), pod("p1", rv=15, labels={"x": "y"}), pod("new", rv=16)], 30)
        await until(lambda: p.follower_cacher.rv == 30)
        assert state(p.follower_cacher) == state(p.owner)
        frames = b"".join(w.pending)
        assert frames.count(b'"type":"DELETED"') == 3 and b'"type":"ADDED"' in frames and b'"type":"MODIFIED"' in frames
        assert p.follower_cacher.cache.oldest_rv == 30  # history restarts, as on the owner
    finally:
        await p.stop()


@arun
async def test_follower_that_falls_behind_is_resynced_and_its_watchers_continue(tmp_path, monkeypatch):
    # 20 writes of 200 KB in one loop step: more unsent bytes than the owner keeps for a follower
    # (beyond what the kernel takes: the default socket buffer, not the 4 MB the owner asks for).
    monkeypatch.setattr(owner, "FOLLOW_SNDBUF", 64 << 10)
    p = Pair(tmp_path, max_buffer=1 << 20)
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), p.follower_cacher.rv, NullSink())
        p.follower_cacher.add_watcher(w)
        for i in range(20):
            p.rv += 1
            p.owner.apply([(MODIFIED, big_pod(f"p{i % 5}", p.rv, size=200_000, labels={"i": str(i)}))])
        await until(lambda: p.follower_cacher.rv == p.rv and p.follower.resyncs >= 1)
        assert state(p.follower_cacher) == state(p.owner)
        # the watcher saw the net change of every pod and was never ended
        assert not w.closed
        frames = b"".join(w.pending)
        for i in range(15, 20):
            assert f'"i":"{i}"'.encode() in frames
    finally:
        await p.stop()


class Transport(asyncio.WriteTransport):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[bytes] = []

    def write(self, data) -> None:  # type: ignore[no-untyped-def]
        self.frames.extend(FrameDecoder().feed(bytes(data)))

    def writelines(self, list_of_data) -> None:  # type: ignore[no-untyped-def]
        for data in list_of_data:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


def test_live_changes_reach_the_follower_socket_in_the_step_that_applies_them():
    c = Cacher(PODS, CacheConfig(), lambda: 0.0)
    c.replace([], 1)
    t = Transport()
    feed = ReplicaFeed(t, max_buffer=1 << 20)
    c.replicas.append(feed)
    c.apply([(MODIFIED, pod("a", "ns", 2))])
    assert t.frames == []  # queued behind the snapshot until go_live
    feed.go_live()
    c.progress(5)
    c.apply([(DELETED, pod("a", "ns", 6))])
    msgs = [pb.FollowBatch.FromString(f) for f in t.frames]  # no await anywhere: written synchronously
    assert [m.WhichOneof("kind") for m in msgs] == ["events", "progress", "events"]
    assert [c.object.resource_version for m in msgs if m.events.changes for c in m.events.changes] == [2, 6]
    assert msgs[1].progress == 5


def test_frames_split_across_reads_are_reassembled():
    frames = [encode_frame(pb.FollowBatch(progress=rv)) for rv in (7, 300, 70_000)]
    stream = b"".join(frames)
    d = FrameDecoder()
    got = []
    for i in range(0, len(stream), 3):
        got += d.feed(stream[i : i + 3])
    assert [pb.FollowBatch.FromString(g).progress for g in got] == [7, 300, 70_000]


def big_pod(name: str, rv: int, size: int = 20_000, labels: dict[str, str] | None = None) -> CachedObject:
    meta = {"name": name, "namespace": "ns", "resourceVersion": str(rv), "annotations": {"a": "x" * size}}
    obj = {
        "metadata": {**meta, "labels": labels or {}},
        "spec": {"nodeName": "n1"},
    }
    return encode_object(PODS, obj)


@arun
async def test_large_objects_replicate_in_messages_of_bounded_size(tmp_path):
    # 600 objects of 20 KB: a 12 MB snapshot and, below, a 6 MB burst of events. Messages are cut
    # by bytes as well as by count (the snapshot and history); the follower takes any size.
    p = Pair(tmp_path)
    p.owner.replace([big_pod(f"p{i}", i + 1) for i in range(600)], 1000)
    p.rv = 1000
    p.owner.apply([(MODIFIED, big_pod(f"p{i}", 1001 + i)) for i in range(100)])  # history: 2 MB
    p.rv = 1100
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready, timeout=20)
        for i in range(300):  # in one loop step: one queued burst for the follower
            p.rv += 1
            p.owner.apply([(MODIFIED, big_pod(f"p{i}", p.rv))])
        await until(lambda: p.follower_cacher.rv == p.rv, timeout=20)
        assert state(p.follower_cacher) == state(p.owner)
        assert p.follower.resyncs == 0
    finally:
        await p.stop()


def test_event_batches_cut_by_count_and_bytes_but_never_inside_an_rv_group(monkeypatch):
    monkeypatch.setattr(owner, "EVENT_BATCH", 3)
    monkeypatch.setattr(owner, "MESSAGE_BYTES", 50_000)
    c = Cacher(PODS, CacheConfig(), lambda: 0.0)
    c.replace([], 1)
    events = c.apply([(MODIFIED, pod(f"s{i}", "ns", 2)) for i in range(5)])  # one rv group of 5
    events += c.apply([(MODIFIED, pod(f"p{i}", "ns", 3 + i)) for i in range(4)])
    events += c.apply([(MODIFIED, big_pod(f"b{i}", 7 + i, size=30_000)) for i in range(3)])
    batches = owner.event_batches(events)
    assert [[e.rv for e in b] for b in batches] == [[2, 2, 2, 2, 2], [3, 4, 5], [6, 7], [8], [9]]
    assert [e for b in batches for e in b] == events


def test_object_batches_cut_by_count_and_bytes(monkeypatch):
    monkeypatch.setattr(owner, "SNAPSHOT_BATCH", 2)
    monkeypatch.setattr(owner, "MESSAGE_BYTES", 50_000)
    small = [pod(f"p{i}", "ns", 1) for i in range(3)]
    big = [big_pod(f"b{i}", 1, size=60_000) for i in range(2)]
    batches = owner.object_batches([*small, *big])
    assert [[o.name for o in b] for b in batches] == [["p0", "p1"], ["p2"], ["b0"], ["b1"]]
    assert owner.object_batches([]) == [[]]  # an empty snapshot is still one (last) message


@arun
async def test_a_failing_owner_stream_is_cut_and_the_follower_follows_again(tmp_path, monkeypatch):
    real = owner.snapshot_to_pb
    calls = []

    def failing_once(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(*a, **kw)

    monkeypatch.setattr(owner, "snapshot_to_pb", failing_once)
    p = Pair(tmp_path)
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        assert len(calls) >= 2 and state(p.follower_cacher) == state(p.owner)
        assert p.owner.replicas and len(p.owner.replicas) == 1  # the failed stream's feed is gone
    finally:
        await p.stop()


@arun
async def test_a_feed_that_raises_is_cut_the_follower_resyncs_and_the_owners_watchers_lose_nothing(
    tmp_path, monkeypatch
):
    p = Pair(tmp_path)
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        local = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), p.owner.rv, NullSink())
        p.owner.add_watcher(local)
        remote = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), p.follower_cacher.rv, NullSink())
        p.follower_cacher.add_watcher(remote)
        real = owner.events_to_pb

        def failing(events):  # type: ignore[no-untyped-def]
            if any(e.object.name == "p3" for e in events):
                raise RuntimeError("a bug encoding this change for followers")
            return real(events)

        monkeypatch.setattr(owner, "events_to_pb", failing)
        rv = p.write(MODIFIED, "p3", labels={"v": "2"})
        monkeypatch.setattr(owner, "events_to_pb", real)
        # The owner's own watcher got the change in the same step; the follower's stream was cut.
        assert b'"name":"p3"' in b"".join(local.pending)
        assert p.owner.failures == {"replica": 1}
        # The follower follows again from a snapshot and hands its watcher the difference.
        await until(lambda: p.follower_cacher.rv >= rv and p.follower.resyncs == 1)
        assert state(p.follower_cacher) == state(p.owner)
        assert b'"name":"p3"' in b"".join(remote.pending) and not remote.closed
    finally:
        await p.stop()


@arun
async def test_a_follower_refuses_a_resume_the_owner_refuses_at_its_window_start(tmp_path):
    # A group of events at one rv (from an upstream watch cache) partly evicted from the window:
    # its rv is the window's start, and a resume there is ambiguous on the owner and the follower.
    p = Pair(tmp_path)
    p.owner.cache.history.max_events = 2
    p.owner.apply([(MODIFIED, pod(f"p{i}", rv=11)) for i in range(3)])
    p.owner.apply([(MODIFIED, pod("p0", rv=12))])
    assert p.owner.cache.oldest_rv == 11
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        for cacher in (p.owner, p.follower_cacher):
            with pytest.raises(ResourceVersionTooOld):
                cacher.cache.events_since(11)
    finally:
        await p.stop()


@arun
async def test_a_workers_metrics_are_asked_for_on_its_follow_socket_while_a_follower_streams(tmp_path):
    """The other workers' /metrics request and a follow stream share the socket; an exposition
    larger than gRPC's 4 MB default message limit and than one socket read arrives whole."""
    p = Pair(tmp_path)
    exposition = b"".join(b'watchcache_x{worker="0",n="%d"} 1\n' % i for i in range(200_000))
    assert len(exposition) > 4 << 20
    p.service.metrics_text = lambda: exposition
    await p.start()
    try:
        await until(lambda: p.follower_cacher.ready)
        replies = await asyncio.gather(*(owner.fetch_metrics(p.sock) for _ in range(3)))
        assert replies == [exposition] * 3
        p.write(MODIFIED, "p1", labels={"v": "after"})
        await until(lambda: p.follower_cacher.rv == p.rv)  # the follow stream goes on
    finally:
        await p.stop()


@arun
async def test_a_bad_worker_request_is_refused_and_the_socket_serves_on(tmp_path):
    p = Pair(tmp_path)
    await p.start()
    try:
        reader, writer = await asyncio.open_unix_connection(p.sock)
        writer.write(encode_frame(pb.WorkerRequest()))  # neither follow nor metrics
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # aborted without a reply
        writer.close()
        assert await owner.fetch_metrics(p.sock) == b""
        await until(lambda: p.follower_cacher.ready)
    finally:
        await p.stop()


def test_a_follow_connection_asks_for_a_large_kernel_buffer():
    """A saturated owner must hand a whole pass's events to the kernel at once (see FOLLOW_SNDBUF)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    default = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)

    class SocketTransport(Transport):
        def get_extra_info(self, name, default=None):  # type: ignore[no-untyped-def]
            return ours if name == "socket" else default

    try:
        owner._FollowConnection(FollowServer(lambda _: None)).connection_made(SocketTransport())
        got = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
        # Linux doubles the value asked for (bookkeeping), capped at net.core.wmem_max.
        assert got >= min(owner.FOLLOW_SNDBUF, wmem_max)
        assert got > default or wmem_max <= default
    finally:
        ours.close()
        theirs.close()

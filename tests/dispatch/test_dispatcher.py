from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable

import orjson
import pytest

from harness.doubles import RecordingSink
from tests.support.factories import pod
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.dispatcher import Dispatcher, WatcherGroup, group_key
from watchcache.resources import PODS
from watchcache.watchers.watcher import CloseReason, Watcher


@pytest.fixture
def offers(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[Hashable]:
    """How many events each watcher group was offered (the per-event work of dispatch)."""
    counts: collections.Counter[Hashable] = collections.Counter()
    real = WatcherGroup.offer

    def offer(self: WatcherGroup, event, touched) -> None:  # type: ignore[no-untyped-def]
        counts[self.key] += 1
        real(self, event, touched)

    monkeypatch.setattr(WatcherGroup, "offer", offer)
    return counts


def offered(counts: collections.Counter[Hashable], w: Watcher) -> int:
    return counts[group_key(w.predicate, w.encoding)]


def watcher(ns: str | None = None, fields: str = "", labels: str = "", start_rv: int = 0, cls=Watcher, **kw) -> Watcher:
    return cls(PODS, SelectionPredicate.parse(PODS, ns, labels, fields), start_rv, RecordingSink(), **kw)


def cache() -> ResourceCache:
    c = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    c.replace([pod("a", "ns1", node="n1"), pod("b", "ns2", node="n2")], 10)
    return c


def test_kubelet_style_watchers_are_only_offered_their_node_events(offers):
    d = Dispatcher(PODS)
    per_node = [watcher(fields=f"spec.nodeName=n{i}") for i in range(1000)]
    for w in per_node:
        d.add(w, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, node="n1"))]))
    assert [offered(offers, w) for w in per_node[:3]] == [0, 1, 0]
    assert sum(offers.values()) == 1
    assert len(per_node[1].pending) == 1 and not per_node[0].pending


def test_pod_moving_node_reaches_watchers_of_old_and_new_node():
    d = Dispatcher(PODS)
    old, new = watcher(fields="spec.nodeName=n1"), watcher(fields="spec.nodeName=n9")
    d.add(old, 0.0)
    d.add(new, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, node="n9"))]))
    assert old.pending and b'"type":"DELETED"' in old.pending[0]
    assert new.pending and b'"type":"ADDED"' in new.pending[0]


def test_namespace_watchers_do_not_see_other_namespaces(offers):
    d = Dispatcher(PODS)
    w1, w2, everyone = watcher("ns1"), watcher("ns2"), watcher()
    for w in (w1, w2, everyone):
        d.add(w, 0.0)
    c = cache()
    d.dispatch(c.apply([(DELETED, pod("a", "ns1", 11))]))
    assert (offered(offers, w1), offered(offers, w2), offered(offers, everyone)) == (1, 0, 1)
    assert (len(w1.pending), len(w2.pending), len(everyone.pending)) == (1, 0, 1)


def test_watchers_with_an_equal_predicate_share_one_group_and_one_frame_choice(offers):
    d = Dispatcher(PODS)
    same = [watcher("ns1", labels="app=web,tier=front") for _ in range(50)]
    # The same selector written differently is the same predicate.
    same.append(watcher("ns1", labels="tier=front , app=web"))
    other = watcher("ns1", labels="app=db")
    for w in [*same, other]:
        d.add(w, 0.0)
    assert len(d.groups) == 2
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, labels={"app": "web", "tier": "front"}))]))
    assert offered(offers, same[0]) == 1 and offered(offers, other) == 1
    assert all(w.pending == same[0].pending for w in same) and same[0].pending
    assert not other.pending
    for w in same:
        d.remove(w)
    assert [g.watchers for g in d.groups.values()] == [{other: None}]
    d.remove(other)
    assert d.groups == {} and d.by_namespace == {}


def test_a_batch_reaches_each_watcher_as_one_write_in_event_order():
    d = Dispatcher(PODS)
    ws = [watcher() for _ in range(3)]
    only_ns2 = watcher("ns2")
    for w in [*ws, only_ns2]:
        d.add(w, 0.0)
    c = cache()
    d.dispatch(
        c.apply([(MODIFIED, pod("a", "ns1", 11)), (MODIFIED, pod("b", "ns2", 12)), (DELETED, pod("a", "ns1", 13))])
    )
    assert len(ws[0].pending) == 1 and ws[0].pending[0] is ws[1].pending[0] is ws[2].pending[0]
    lines = ws[0].pending[0].splitlines()
    assert [orjson.loads(line)["type"] for line in lines] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert [orjson.loads(line)["object"]["metadata"]["resourceVersion"] for line in lines] == ["11", "12", "13"]
    assert ws[0].take()[1] == 3
    assert ws[0].flushed_rv == 13
    assert only_ns2.take()[1] == 1 and only_ns2.flushed_rv == 12
    assert d.events_dispatched == 3 * 3 + 1


def test_a_watcher_starting_inside_a_batch_gets_only_the_events_after_its_start():
    d = Dispatcher(PODS)
    early, late = watcher(start_rv=10), watcher(start_rv=11)
    d.add(early, 0.0)
    d.add(late, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11)), (MODIFIED, pod("b", "ns2", 12))]))
    assert early.take()[1] == 2
    frames, events = late.take()
    assert events == 1 and b'"resourceVersion":"11"' not in b"".join(frames)


def test_one_frame_object_is_shared_by_all_watchers():
    d = Dispatcher(PODS)
    ws = [watcher() for _ in range(3)]
    for w in ws:
        d.add(w, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11))]))
    assert ws[0].pending[0] is ws[1].pending[0] is ws[2].pending[0]


def test_remove_drops_empty_index_buckets():
    d = Dispatcher(PODS)
    w = watcher(fields="spec.nodeName=n1")
    d.add(w, 0.0)
    d.remove(w)
    assert d.by_trigger == {} and len(d) == 0


def test_events_at_or_before_start_rv_are_not_delivered():
    w = watcher(start_rv=11)
    c = cache()
    for e in c.apply([(MODIFIED, pod("a", "ns1", 11))]) + c.apply([(MODIFIED, pod("a", "ns1", 12))]):
        w.deliver(e)
    assert len(w.pending) == 1 and b'"resourceVersion":"12"' in w.pending[0]


def test_watcher_over_its_buffer_cap_without_history_is_closed_and_frees_memory():
    w = watcher(max_pending_bytes=1000, can_lag=False)
    c = cache()
    for rv in range(11, 20):
        for e in c.apply([(MODIFIED, pod("a", "ns1", rv))]):
            w.deliver(e)
    assert w.closed and w.close_reason == CloseReason.BUFFER_OVERFLOW
    assert w.pending == [] and w.sink.closed_reasons == ["buffer_overflow"]  # type: ignore[attr-defined]


def test_slow_watcher_lags_then_catches_up_from_history_without_gap_or_duplicate():
    """The real cycle: ``Cacher.start_watch`` starts it, the dispatcher feeds it, ``Cacher.catch_up`` replays."""

    async def run() -> None:
        c = Cacher(PODS, clock=lambda: 0.0)
        c.replace([pod("a", "ns1", node="n1"), pod("b", "ns2", node="n2")], 10)
        plan = WatchPlan(Mode.EXACT, 10, initial_events=False, initial_events_end_bookmark=False)
        request = WatchRequest(SelectionPredicate.parse(PODS, "ns1", "", ""), plan, max_pending_bytes=1500)
        w = c.start_watch(request, RecordingSink())
        delivered: list[int] = []

        def read_all() -> None:
            for frame in w.take()[0]:
                delivered.append(int(frame.split(b'"resourceVersion":"')[1].split(b'"')[0]))

        c.apply([(MODIFIED, pod("a", "ns1", 11))])
        read_all()  # the client read rv 11
        for rv in range(12, 30):  # then stopped reading
            c.apply([(MODIFIED, pod("a", "ns1", rv))])
        assert w.lagging and w.resume_rv == 11 and w.pending_bytes == 0
        assert c.watchers_lagged == 1
        c.apply([(MODIFIED, pod("a", "ns1", 30))])  # ignored while lagging: it stays in history
        assert not w.pending
        steps = 1
        while c.catch_up(w):  # what the sink runs each time the client has drained
            steps += 1
            read_all()
        read_all()
        assert steps > 1  # bounded steps, not the whole backlog at once
        assert not w.lagging and c.watchers_caught_up == 1
        c.apply([(MODIFIED, pod("a", "ns1", 31))])
        read_all()
        assert delivered == list(range(11, 32))
        assert not c.catch_up(w)  # live: nothing to do

    asyncio.run(run())


def test_initial_events_survive_an_overflow():
    w = watcher(max_pending_bytes=500, start_rv=10)
    w.deliver_initial([b"initial-1", b"initial-2"], 10)
    c = cache()
    for rv in range(11, 20):
        for e in c.apply([(MODIFIED, pod("a", "ns1", rv))]):
            w.deliver(e)
    assert w.lagging and w.pending == [b"initial-1", b"initial-2"] and w.resume_rv == 10


def test_bookmark_schedule_is_periodic_and_just_before_the_deadline():
    w = watcher(allow_bookmarks=True, deadline=100.0, bookmark_interval=10.0)
    assert w.next_bookmark(0.0) == 10.0
    assert w.next_bookmark(95.0) == 98.0
    assert w.next_bookmark(99.0) is None
    assert watcher(bookmark_interval=10.0).next_bookmark(0.0) is None


def test_due_bookmarks_share_one_frame_and_are_rescheduled():
    d = Dispatcher(PODS)
    ws = [watcher(allow_bookmarks=True, bookmark_interval=5.0) for _ in range(2)]
    for w in ws:
        d.add(w, 0.0)
    assert d.send_due_bookmarks(4.0, 20) == 0
    assert d.send_due_bookmarks(5.0, 20) == 2
    assert ws[0].pending[0] is ws[1].pending[0]
    assert d.send_due_bookmarks(9.0, 21) == 0
    assert d.send_due_bookmarks(10.0, 21) == 2


# ---------------------------------------------------------------- encodings


def test_watchers_of_one_predicate_but_other_encodings_never_share_frames():
    from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF

    d = Dispatcher(PODS)
    encodings = [FULL_JSON, METADATA_JSON["v1"], METADATA_PROTOBUF["v1"]]
    by_encoding = {e: [watcher("ns1", encoding=e), watcher("ns1", encoding=e)] for e in encodings}
    for ws in by_encoding.values():
        for w in ws:
            d.add(w, 0.0)
    assert len(d.groups) == 3
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, labels={"x": "y"}))]))
    frames = {e: ws[0].pending[0] for e, ws in by_encoding.items()}
    for e, ws in by_encoding.items():
        assert ws[1].pending[0] is frames[e]  # built once, shared within the encoding
    assert orjson.loads(frames[FULL_JSON])["object"]["kind"] == "Pod"
    meta = orjson.loads(frames[METADATA_JSON["v1"]])["object"]
    assert meta["kind"] == "PartialObjectMetadata" and "spec" not in meta
    assert frames[METADATA_PROTOBUF["v1"]][4:].startswith(b"\n\x08MODIFIED")
    # bookmarks: one frame per encoding, each in its encoding
    d2 = Dispatcher(PODS)
    ws = [watcher(allow_bookmarks=True, bookmark_interval=1.0, encoding=e) for e in encodings for _ in range(2)]
    for w in ws:
        d2.add(w, 0.0)
    assert d2.send_due_bookmarks(1.0, 30) == 6
    assert ws[0].pending[0] is ws[1].pending[0] and ws[2].pending[0] is ws[3].pending[0]
    assert orjson.loads(ws[2].pending[0])["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "30"},
    }
    assert ws[4].pending[0][4:].startswith(b"\n\x08BOOKMARK")


def test_a_lagging_metadata_watcher_catches_up_in_its_encoding():
    from watchcache.cache.encoding import METADATA_JSON

    c = cache()
    w = watcher(start_rv=10, encoding=METADATA_JSON["v1"], max_pending_bytes=10)
    events = c.apply([(MODIFIED, pod("a", "ns1", 11))])
    assert w.replay(events)
    assert orjson.loads(w.pending[0])["object"]["kind"] == "PartialObjectMetadata"
    assert w.frame_for(events[0]) is w.pending[0]


def test_bookmarks_fall_due_in_whole_seconds_of_the_cacher_clock_as_kube():
    # kube's watcherBookmarkTimeBuckets: due at X, sent at the first tick after epoch + floor(X - epoch).
    d = Dispatcher(PODS, epoch=0.3)
    probe = watcher(allow_bookmarks=True, deadline=1.9 + 3, bookmark_interval=60.0)  # timeoutSeconds=3 at 1.9
    d.add(probe, 1.9)  # due 2 s before the deadline, at 2.9: in the bucket that starts at 2.3
    assert d.send_due_bookmarks(2.29, 20) == 0
    assert d.send_due_bookmarks(2.31, 20) == 1
    assert probe.pending and b'"resourceVersion":"20"' in probe.pending[0]
    late = watcher(allow_bookmarks=True, deadline=2.35 + 3, bookmark_interval=60.0)
    d.add(late, 2.35)  # due at 3.35: bucket 3.3
    d.send_due_bookmarks(3.2, 21)  # (the probe, still before its due time, gets a second one: as in kube)
    assert not late.pending
    d.send_due_bookmarks(3.3, 21)
    assert late.pending


def test_a_frame_one_encoding_cannot_build_ends_only_that_groups_watchers():
    """Issue 21 item 5, invariant 11: a protobuf metadata frame that raises costs the other groups nothing."""
    from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF
    from watchcache.cache.object import encode_object

    failures: list[str] = []
    d = Dispatcher(PODS, failures.append)
    full, meta, proto = (watcher("ns1", encoding=e) for e in (FULL_JSON, METADATA_JSON["v1"], METADATA_PROTOBUF["v1"]))
    for w in (full, meta, proto):
        d.add(w, 0.0)
    # Metadata protobuf cannot hold (ownerReferences is no list); full JSON and metadata JSON can.
    bad = encode_object(
        PODS, {"metadata": {"name": "bad", "namespace": "ns1", "resourceVersion": "11", "ownerReferences": 5}}
    )
    c = cache()
    d.dispatch(c.apply([("ADDED", bad), (MODIFIED, pod("a", "ns1", 12))]))
    assert proto.closed and proto.close_reason == CloseReason.INTERNAL_ERROR and failures == ["dispatch"]
    assert not full.closed and not meta.closed
    for w in (full, meta):
        lines = b"".join(w.take()[0]).splitlines()
        assert [orjson.loads(line)["object"]["metadata"]["resourceVersion"] for line in lines] == ["11", "12"]
    # The group is whole again for the next batch: a new protobuf watcher gets its frames.
    again = watcher("ns1", start_rv=12, encoding=METADATA_PROTOBUF["v1"])
    d.add(again, 0.0)
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 13))]))
    assert not again.closed and again.take()[0][0][4:].startswith(b"\n\x08MODIFIED")

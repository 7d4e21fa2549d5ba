from __future__ import annotations

from tests.factories import pod
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.resources import PODS
from watchcache.watchers.watcher import CloseReason, Watcher


class Sink:
    def __init__(self) -> None:
        self.woken = 0
        self.closed_reasons: list[str] = []

    def wake(self, watcher: Watcher) -> None:
        self.woken += 1

    def closed(self, watcher: Watcher, reason: str) -> None:
        self.closed_reasons.append(reason)

    def lagging(self, watcher: Watcher) -> None:
        self.lagged = getattr(self, "lagged", 0) + 1


class CountingWatcher(Watcher):
    __slots__ = ("calls",)

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls = 0

    def deliver(self, event):  # type: ignore[override]
        self.calls += 1
        return super().deliver(event)


def watcher(ns: str | None = None, fields: str = "", labels: str = "", start_rv: int = 0, cls=Watcher, **kw) -> Watcher:
    return cls(PODS, SelectionPredicate.parse(PODS, ns, labels, fields), start_rv, Sink(), **kw)


def cache() -> ResourceCache:
    c = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    c.replace([pod("a", "ns1", node="n1"), pod("b", "ns2", node="n2")], 10)
    return c


def test_kubelet_style_watchers_are_only_offered_their_node_events():
    d = Dispatcher(PODS)
    per_node = [watcher(fields=f"spec.nodeName=n{i}", cls=CountingWatcher) for i in range(1000)]
    for w in per_node:
        d.add(w, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, node="n1"))]))
    assert [w.calls for w in per_node[:3]] == [0, 1, 0]
    assert sum(w.calls for w in per_node) == 1
    assert len(per_node[1].pending) == 1


def test_pod_moving_node_reaches_watchers_of_old_and_new_node():
    d = Dispatcher(PODS)
    old, new = watcher(fields="spec.nodeName=n1"), watcher(fields="spec.nodeName=n9")
    d.add(old, 0.0)
    d.add(new, 0.0)
    c = cache()
    d.dispatch(c.apply([(MODIFIED, pod("a", "ns1", 11, node="n9"))]))
    assert old.pending and b'"type":"DELETED"' in old.pending[0]
    assert new.pending and b'"type":"ADDED"' in new.pending[0]


def test_namespace_watchers_do_not_see_other_namespaces():
    d = Dispatcher(PODS)
    w1, w2, everyone = (
        watcher("ns1", cls=CountingWatcher),
        watcher("ns2", cls=CountingWatcher),
        watcher(cls=CountingWatcher),
    )
    for w in (w1, w2, everyone):
        d.add(w, 0.0)
    c = cache()
    d.dispatch(c.apply([(DELETED, pod("a", "ns1", 11))]))
    assert (w1.calls, w2.calls, everyone.calls) == (1, 0, 1)


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
    w = watcher("ns1", max_pending_bytes=1500)
    c = cache()
    delivered: list[int] = []

    def read_all() -> None:
        for frame in w.take():
            delivered.append(int(frame.split(b'"resourceVersion":"')[1].split(b'"')[0]))

    for e in c.apply([(MODIFIED, pod("a", "ns1", 11))]):
        w.deliver(e)
    read_all()  # the client read rv 11
    for rv in range(12, 30):  # then stopped reading
        for e in c.apply([(MODIFIED, pod("a", "ns1", rv))]):
            w.deliver(e)
    assert w.lagging and w.resume_rv == 11 and w.pending_bytes == 0
    # new events are ignored while lagging; they stay in history
    for e in c.apply([(MODIFIED, pod("a", "ns1", 30))]):
        assert not w.deliver(e)
    steps = 0
    while True:
        steps += 1
        done = w.catch_up(c.events_since(w.resume_rv))
        read_all()
        if done:
            break
    assert steps > 1  # bounded steps, not the whole backlog at once
    assert not w.lagging
    for e in c.apply([(MODIFIED, pod("a", "ns1", 31))]):
        w.deliver(e)
    read_all()
    assert delivered == list(range(11, 32))


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

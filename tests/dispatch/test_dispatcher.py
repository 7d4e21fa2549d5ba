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


def test_watcher_over_its_buffer_cap_is_closed_and_frees_memory():
    w = watcher(max_pending_bytes=1000)
    c = cache()
    for rv in range(11, 20):
        for e in c.apply([(MODIFIED, pod("a", "ns1", rv))]):
            w.deliver(e)
    assert w.closed and w.close_reason == CloseReason.BUFFER_OVERFLOW
    assert w.pending == [] and w.sink.closed_reasons == ["buffer_overflow"]  # type: ignore[attr-defined]


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

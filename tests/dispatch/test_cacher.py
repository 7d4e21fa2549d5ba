"""Cacher: each output path (follower replicas, local watchers) is independent of the others.

A change is applied to the cache once; then every replica is fed and every watcher gets its
frames. A failure on one path must cost no other path an event, and must not leave the path
that failed silently short: a replica whose feed raised is cut (its follower resyncs from a
snapshot, as when it falls too far behind), a watcher whose delivery raised is ended (its client
resumes from the last event it read, from history).
"""

from __future__ import annotations

import pytest

from harness.doubles import RecordingSink, WakeFailsSink
from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.dispatch import dispatcher as dispatcher_module
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.watchers.watcher import CloseReason, Watcher


class Replica:
    """A follower's feed; ``fail`` names the call that raises."""

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.got: list[tuple[str, object]] = []
        self.cut_because: list[str] = []

    def _call(self, name: str, what: object) -> None:
        if name == self.fail:
            raise RuntimeError(f"{name} failed")
        self.got.append((name, what))

    def on_events(self, events: list[WatchEvent]) -> None:
        self._call("events", [e.rv for e in events])

    def on_progress(self, rv: int) -> None:
        self._call("progress", rv)

    def on_relist(self, events: list[WatchEvent], rv: int) -> None:
        self._call("relist", rv)

    def cut(self, why: str) -> None:
        self.cut_because.append(why)


def cacher() -> Cacher:
    c = Cacher(PODS)
    c.replace([pod("a", rv=1), pod("b", rv=2)], 10)
    return c


def watch(c: Cacher, labels: str = "", *, fail_wake: bool = False) -> Watcher:
    w = Watcher(
        PODS,
        SelectionPredicate.parse(PODS, None, labels, ""),
        c.rv,
        (WakeFailsSink() if fail_wake else RecordingSink()),
    )
    c.add_watcher(w)
    return w


def names(w: Watcher) -> list[str]:
    import orjson

    frames, _ = w.take()
    return [orjson.loads(line)["object"]["metadata"]["name"] for line in b"".join(frames).splitlines()]


@pytest.mark.parametrize("call", ["events", "progress", "relist"])
def test_a_replica_whose_feed_raises_is_cut_and_costs_no_one_else_anything(call: str) -> None:
    c = cacher()
    first, broken, last = Replica(), Replica(fail=call), Replica()
    c.replicas += [first, broken, last]
    w = watch(c)
    if call == "events":
        c.apply([(ADDED, pod("x", rv=11))])
        assert names(w) == ["x"]
    elif call == "progress":
        c.progress(12)
    else:
        c.relist([pod("a", rv=1), pod("b", rv=2), pod("y", rv=15)], 20)
        assert names(w)[0] == "y"
    # The replicas before and after the broken one got the change; the broken one is cut (its
    # follower resyncs) and no longer fed.
    assert [name for name, _ in first.got] == [call] and first.got == last.got
    assert len(broken.cut_because) == 1 and broken not in c.replicas
    assert c.failures == {"replica": 1}
    c.apply([(MODIFIED, pod("a", rv=30))])
    assert broken.got == [] and last.got[-1] == ("events", [30])


def test_a_watcher_whose_delivery_raises_is_ended_and_the_others_get_the_event() -> None:
    c = cacher()
    before, broken, after = watch(c), watch(c, fail_wake=True), watch(c)
    c.apply([(ADDED, pod("x", rv=11))])
    assert names(before) == ["x"] and names(after) == ["x"]
    assert broken.closed and broken.close_reason == CloseReason.INTERNAL_ERROR
    assert c.failures == {"dispatch": 1}
    # The cache did apply the change, and later changes flow as before.
    assert c.cache.get("default/x") is not None
    c.apply([(MODIFIED, pod("x", rv=12))])
    assert names(after) == ["x"]


def test_a_failure_choosing_a_groups_frame_ends_that_groups_watchers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cacher()
    everyone, selected = watch(c), watch(c, labels="app=web")
    real = dispatcher_module.select_frame

    def select_frame(predicate: SelectionPredicate, event: WatchEvent) -> bytes | None:
        if not predicate.selects_all:
            raise RuntimeError("a bug evaluating this predicate")
        return real(predicate, event)

    monkeypatch.setattr(dispatcher_module, "select_frame", select_frame)
    c.apply([(ADDED, pod("x", rv=11, labels={"app": "web"}))])
    # Nobody is silently short: the group that could not be served is ended (its clients resume
    # from history), the other group got its frame.
    assert names(everyone) == ["x"]
    assert selected.closed and selected.close_reason == CloseReason.INTERNAL_ERROR
    assert c.failures == {"dispatch": 1}


def test_a_failure_outside_any_group_ends_every_watcher_rather_than_leave_one_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = cacher()
    ws = [watch(c), watch(c, labels="app=web")]

    def boom(self: object, events: object) -> None:
        raise RuntimeError("a bug in the fan-out itself")

    monkeypatch.setattr(dispatcher_module.Dispatcher, "_dispatch", boom)
    events = c.apply([(ADDED, pod("x", rv=11))])
    assert [e.rv for e in events] == [11] and c.rv == 11
    assert all(w.closed and w.close_reason == CloseReason.INTERNAL_ERROR for w in ws)
    assert c.failures == {"dispatch": 2}


def test_relist_bookmarks_reach_the_other_watchers_when_one_raises() -> None:
    c = cacher()
    broken = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), 10, WakeFailsSink(), allow_bookmarks=True)
    ok = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), 10, RecordingSink(), allow_bookmarks=True)
    c.add_watcher(broken)
    c.add_watcher(ok)
    c.relist([pod("a", rv=1), pod("b", rv=2)], 20)  # no difference: only the bookmark
    assert broken.closed and broken.close_reason == CloseReason.INTERNAL_ERROR
    frames, _ = ok.take()
    assert b'"BOOKMARK"' in b"".join(frames)


def test_watches_that_saw_a_group_partly_are_ended_with_410_when_the_rest_arrives() -> None:
    # An upstream watch cache's group of deletions at 20, split across two reads.
    import orjson

    c = cacher()  # a, b at rv 10
    c.apply([(ADDED, pod("c", "other", rv=11))])
    before = watch(c)  # from 11: will get the whole group live
    bookmarked = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), 11, RecordingSink(), allow_bookmarks=True)
    c.add_watcher(bookmarked)
    c.apply([(DELETED, pod("a", rv=20))])
    bookmarked.bookmark(20)  # a periodic bookmark between the two reads: it promised all of 20
    at_20 = watch(c)  # started (or listed) at 20 with only the first part
    elsewhere = Watcher(PODS, SelectionPredicate.parse(PODS, "other", "", ""), 20, RecordingSink())
    c.add_watcher(elsewhere)  # nothing of the group concerns it
    c.apply([(DELETED, pod("b", rv=20))])
    assert names(before) == ["a", "b"] and not before.closed
    for w in (at_20, bookmarked):
        assert w.closed and w.close_reason == CloseReason.EXPIRED
        last = orjson.loads(b"".join(w.pending).splitlines()[-1])
        assert (last["type"], last["object"]["code"]) == ("ERROR", 410)
    assert not elsewhere.closed
    # A client that saw rv 20 while the group was partial may resume later: refused whatever its
    # selector, as long as some event at 20 concerns it.
    with pytest.raises(ResourceVersionTooOld):
        c.cache.events_since(20, SelectionPredicate.parse(PODS, None, "", "metadata.name=b"))
    assert c.cache.events_since(20, SelectionPredicate.parse(PODS, "other", "", "")) == []
    assert c.split_groups == 1

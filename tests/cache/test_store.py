import pytest

from tests.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.store import (
    CacheConfig,
    ResourceCache,
    ResourceVersionOrderError,
    ResourceVersionTooNew,
    ResourceVersionTooOld,
)
from watchcache.resources import PODS


def new_cache(max_events: int = 100, clock=lambda: 0.0) -> ResourceCache:
    c = ResourceCache(PODS, CacheConfig(history_max_events=max_events), clock)
    c.replace([pod("a", rv=1), pod("b", rv=2)], rv=10)
    return c


def keys(snapshot) -> list[str]:
    return [o.key for o in snapshot.iter_range("", None)]


def test_apply_normalises_event_types_from_previous_state():
    c = new_cache()
    events = c.apply([(ADDED, pod("a", rv=11)), (MODIFIED, pod("z", rv=12)), (DELETED, pod("b", rv=13))])
    assert [(e.type, e.object.key) for e in events] == [
        (MODIFIED, "default/a"),
        (ADDED, "default/z"),
        (DELETED, "default/b"),
    ]
    assert events[0].prev is not None and events[0].prev.rv == 1
    assert c.rv == 13
    assert keys(c.snapshot()) == ["default/a", "default/z"]


def test_apply_rejects_rv_going_backwards_or_splitting_a_group():
    c = new_cache()
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("x", rv=10))])  # not after the current rv
    c.apply([(ADDED, pod("x", rv=11)), (ADDED, pod("y", rv=11))])  # one group, one batch: fine
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("w", rv=11))])  # would split the group at 11
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("w", rv=13)), (ADDED, pod("v", rv=12))])


def test_snapshot_at_an_older_rv_undoes_later_events_exactly():
    c = new_cache()
    c.apply([(MODIFIED, pod("a", rv=11, labels={"v": "2"}))])
    c.apply([(DELETED, pod("b", rv=12))])
    c.apply([(ADDED, pod("c", rv=13))])
    at10 = c.snapshot(10)
    assert keys(at10) == ["default/a", "default/b"]
    assert at10.get("default/a").rv == 1
    at11 = c.snapshot(11)
    assert keys(at11) == ["default/a", "default/b"] and at11.get("default/a").rv == 11
    assert keys(c.snapshot(12)) == ["default/a"]
    assert keys(c.snapshot(13)) == ["default/a", "default/c"]
    assert c.snapshot(12).count_range("", None) == 1
    assert c.snapshot(10).count_range("default/b", None) == 1


def test_snapshot_outside_the_window_raises():
    c = new_cache(max_events=2)
    for rv in (11, 12, 13):
        c.apply([(MODIFIED, pod("a", rv=rv))])
    assert c.oldest_rv == 11
    with pytest.raises(ResourceVersionTooOld) as old:
        c.snapshot(10)
    assert str(old.value) == "too old resource version: 10 (11)"
    with pytest.raises(ResourceVersionTooNew):
        c.snapshot(14)
    assert c.snapshot(11).get("default/a").rv == 11


def test_progress_advances_rv_without_events_and_reads_between_are_exact():
    c = new_cache()
    c.apply([(MODIFIED, pod("a", rv=11))])
    assert c.progress(20)
    assert not c.progress(15)
    assert c.snapshot(15).get("default/a").rv == 11
    assert c.events_since(15) == []
    assert [e.rv for e in c.events_since(10)] == [11]


def test_events_since_before_window_is_too_old():
    c = new_cache(max_events=1)
    c.apply([(MODIFIED, pod("a", rv=11))])
    c.apply([(MODIFIED, pod("a", rv=12))])
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(10)
    assert [e.rv for e in c.events_since(11)] == [12]


def test_stats_count_objects_and_bytes():
    c = new_cache()
    s = c.stats()
    assert s.objects == 2 and s.object_bytes == sum(len(o.body) for o in c.snapshot().iter_range("", None))
    c.apply([(DELETED, pod("a", rv=11))])
    assert c.stats().objects == 1 and c.stats().history_events == 1


def test_replace_restarts_history_at_the_list_rv():
    c = new_cache()
    c.apply([(MODIFIED, pod("a", rv=11))])
    c.replace([pod("q", rv=30)], rv=40)
    assert c.oldest_rv == 40 and len(c.history) == 0
    with pytest.raises(ResourceVersionTooOld):
        c.snapshot(11)


def test_relist_turns_the_difference_into_events_at_the_new_rv_and_restarts_history():
    c = new_cache()  # a@1, b@2 at rv 10
    c.apply([(ADDED, pod("c", rv=11))])
    events = c.relist([pod("a", rv=15, labels={"new": "y"}), pod("c", rv=11), pod("d", rv=17)], rv=20)
    got = sorted((e.type, e.object.key, e.rv) for e in events)
    assert got == [(ADDED, "default/d", 20), (DELETED, "default/b", 20), (MODIFIED, "default/a", 20)]
    deleted = next(e for e in events if e.type == DELETED)
    assert deleted.object.rv == 20 and b'"resourceVersion":"20"' in deleted.object.body
    assert deleted.prev is not None and deleted.prev.rv == 2
    assert c.rv == 20 and c.oldest_rv == 20
    assert keys(c.snapshot()) == ["default/a", "default/c", "default/d"]
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(15)  # inside the gap: cannot be served exactly


def test_relist_with_identical_state_produces_no_events():
    c = new_cache()
    assert c.relist([pod("a", rv=1), pod("b", rv=2)], rv=30) == []
    assert c.rv == 30


def test_a_resume_from_inside_a_relist_group_is_refused_not_partial():
    c = new_cache()  # a@1, b@2 at rv 10
    c.relist([pod("c", rv=15)], rv=20)  # ADDED c, DELETED a, DELETED b: three events at rv 20
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(20)  # a client may have seen only the first DELETED at 20
    c.apply([(ADDED, pod("d", rv=21))])
    assert [e.rv for e in c.events_since(21)] == []
    c.apply([(ADDED, pod("e", rv=22))])
    assert [e.object.key for e in c.events_since(21)] == ["default/e"]

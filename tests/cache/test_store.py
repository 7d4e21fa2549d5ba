import pytest

from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
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


def test_apply_refuses_rvs_going_backwards_and_an_event_at_a_listed_or_bookmarked_rv():
    c = new_cache()
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("x", rv=10))])  # the list's rv: nothing can happen at it any more
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("x", rv=9))])
    c.apply([(ADDED, pod("x", rv=11)), (ADDED, pod("y", rv=11))])  # one group, one batch: fine
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("w", rv=13)), (ADDED, pod("v", rv=12))])
    c.progress(12)
    with pytest.raises(ResourceVersionOrderError):
        c.apply([(ADDED, pod("w", rv=12))])  # bookmarked
    assert c.rv == 12 and c.get("default/w") is None  # a refused batch changes nothing


def test_a_group_split_across_two_batches_is_continued():
    # An upstream that is itself a watch cache sends a group (several events at one rv), and a
    # network read may end inside it: the next batch starts at the cache's rv.
    c = new_cache()
    c.apply([(DELETED, pod("a", rv=20))])
    events = c.apply([(DELETED, pod("b", rv=20)), (ADDED, pod("c", rv=21))])
    assert [(e.type, e.object.key, e.rv) for e in events] == [(DELETED, "default/b", 20), (ADDED, "default/c", 21)]
    assert keys(c.snapshot()) == ["default/c"] and keys(c.snapshot(20)) == []
    assert [e.object.key for e in c.events_since(10)] == ["default/a", "default/b", "default/c"]
    assert c.group_size(20) == 2 and c.group_size(21) == 1


def test_a_resume_at_an_rv_several_events_share_is_refused_unless_one_concerns_the_watch():
    c = new_cache()
    c.apply([(DELETED, pod("a", rv=20)), (DELETED, pod("b", rv=20))])
    c.apply([(ADDED, pod("c", rv=21))])
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(20)  # a client holding 20 may have seen only DELETED a
    assert [e.rv for e in c.events_since(10)] == [20, 20, 21]
    assert [e.rv for e in c.events_since(21)] == []
    # A watch concerned by at most one of the events at 20 cannot have seen part of them.
    for name in ("a", "c"):
        only = SelectionPredicate.parse(PODS, "default", "", f"metadata.name={name}")
        assert [e.object.key for e in c.events_since(20, only)] == ["default/c"]  # the watcher filters
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(20, SelectionPredicate.parse(PODS, "default", "", ""))


def test_a_group_evicted_in_part_stays_ambiguous_at_the_window_start():
    c = new_cache(max_events=2)
    c.apply([(MODIFIED, pod(n, rv=20)) for n in ("a", "b", "x")])  # more than the window: evicted at once
    c.apply([(MODIFIED, pod("y", rv=20))])  # the rest of the group, after the window moved to 20
    assert c.oldest_rv == 20 and c.group_size(20) == 4
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(20)


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


def frames(events) -> list[tuple[str, str, int]]:
    """What a client sees of each event: type, name, the object's rv."""
    return [(e.type, e.object.name, e.object.rv) for e in events]


def test_a_relist_diff_ends_with_its_only_frame_at_the_new_rv_so_a_resume_there_is_served():
    c = new_cache()  # a@1, b@2 at rv 10
    events = c.relist([pod("c", rv=15)], rv=20)
    # ADDED c at its own rv, then the deletions: all but the last stamped 19, the last 20.
    assert frames(events) == [(ADDED, "c", 15), (DELETED, "a", 19), (DELETED, "b", 20)]
    assert all(e.rv == 20 for e in events)  # one group in the cache
    assert c.unresumable_rv is None
    assert c.events_since(20) == []  # listed at 20, or got the whole diff: served
    for partial in (15, 19):  # got part of the diff: before the new window, 410
        with pytest.raises(ResourceVersionTooOld):
            c.events_since(partial)
    c.apply([(ADDED, pod("d", rv=21))])
    assert [e.object.key for e in c.events_since(20)] == ["default/d"]


def test_a_relist_diff_with_an_object_at_the_new_rv_puts_it_last_after_the_deletions():
    c = new_cache()  # a@1, b@2 at rv 10
    events = c.relist([pod("b", rv=20, labels={"v": "2"}), pod("c", rv=15), pod("d", rv=19)], rv=20)
    assert frames(events) == [(ADDED, "c", 15), (ADDED, "d", 19), (DELETED, "a", 19), (MODIFIED, "b", 20)]
    assert c.unresumable_rv is None and c.events_since(20) == []


@pytest.mark.parametrize(
    ("listed", "rv"),
    [
        ([pod("c", rv=11)], 11),  # the new rv is the old one + 1: no room below it for the deletions
        ([pod("c", rv=20), pod("d", rv=20)], 20),  # two objects written at one revision
    ],
)
def test_a_relist_diff_with_several_frames_at_the_new_rv_refuses_a_resume_there(listed, rv):
    c = new_cache()  # a@1, b@2 at rv 10
    events = c.relist(listed, rv=rv)
    assert sum(e.object.rv == rv for e in events) > 1
    rvs = [e.object.rv for e in events]
    assert rvs == sorted(rvs) and min(rvs) > 10
    assert c.unresumable_rv == rv
    with pytest.raises(ResourceVersionTooOld):
        c.events_since(rv)  # a client may have seen only part of the frames at rv
    # unless the watch is concerned by at most one of them
    assert c.events_since(rv, SelectionPredicate.parse(PODS, None, "", "metadata.name=a")) == []
    c.apply([(ADDED, pod("e", rv=rv + 1))])
    assert [e.rv for e in c.events_since(rv + 1)] == []

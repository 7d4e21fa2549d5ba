from tests.support.factories import pod
from watchcache.cache.events import ADDED, WatchEvent
from watchcache.cache.history import HistoryWindow
from watchcache.resources import PODS


def ev(rv: int, t: float = 0.0, name: str = "p") -> WatchEvent:
    return WatchEvent(PODS, ADDED, pod(name, rv=rv), None, rv, t)


def test_since_returns_events_strictly_after_rv():
    h = HistoryWindow(10, 300, oldest_rv=1)
    for rv in (2, 3, 5):
        h.append(ev(rv))
    assert [e.rv for e in h.since(1)] == [2, 3, 5]
    assert [e.rv for e in h.since(3)] == [5]
    assert [e.rv for e in h.since(4)] == [5]
    assert h.since(5) == []


def test_count_bound_evicts_oldest_and_advances_oldest_rv():
    h = HistoryWindow(3, 300, oldest_rv=1)
    for rv in range(2, 7):
        h.append(ev(rv))
    assert [e.rv for e in h] == [4, 5, 6]
    assert h.oldest_rv == 3


def test_eviction_never_splits_a_group_of_one_rv():
    h = HistoryWindow(3, 300, oldest_rv=1)
    h.append(ev(2, name="a"))
    h.append(ev(3, name="a"))
    h.append(ev(3, name="b"))
    h.append(ev(3, name="c"))  # 4 > 3: evicts the group at rv 2 only
    assert [e.rv for e in h] == [3, 3, 3]
    h.append(ev(4))  # evicts the whole group at rv 3
    assert [e.rv for e in h] == [4]
    assert h.oldest_rv == 3


def test_age_bound_evicts_events_older_than_max_age():
    h = HistoryWindow(100, 10.0, oldest_rv=1)
    h.append(ev(2, t=0.0))
    h.append(ev(3, t=5.0))
    assert h.expire(now=10.0) == 0
    assert h.expire(now=10.5) == 1
    assert [e.rv for e in h] == [3]
    assert h.oldest_rv == 2


def test_bytes_track_retained_objects():
    h = HistoryWindow(2, 300)
    events = [ev(rv) for rv in (1, 2, 3)]
    for e in events:
        h.append(e)
    assert h.bytes == events[1].size + events[2].size


def test_compaction_keeps_order_over_many_evictions():
    h = HistoryWindow(5, 300)
    for rv in range(1, 5000):
        h.append(ev(rv))
    assert [e.rv for e in h] == list(range(4995, 5000))
    assert [e.rv for e in h.since(4996)] == [4997, 4998, 4999]

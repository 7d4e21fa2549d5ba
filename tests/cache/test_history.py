import pytest

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


def test_prepend_puts_a_span_in_front_and_moves_oldest_rv_back():
    h = HistoryWindow(10, 300, oldest_rv=5)
    h.append(ev(6, t=1.0))
    h.prepend([ev(3, t=1.0), ev(5, t=1.0)], 2)
    assert [e.rv for e in h] == [3, 5, 6]
    assert h.oldest_rv == 2
    assert [e.rv for e in h.since(2)] == [3, 5, 6]
    assert h.bytes == sum(e.size for e in h)


def test_prepend_refuses_what_would_break_the_window():
    h = HistoryWindow(3, 300, oldest_rv=5)
    h.append(ev(6, t=1.0))
    h.append(ev(7, t=1.0))
    with pytest.raises(ValueError, match="do not fit"):
        h.prepend([ev(3, t=1.0), ev(4, t=1.0)], 2)
    with pytest.raises(ValueError, match="out of order"):
        h.prepend([ev(6, t=1.0)], 2)  # past the window's start
    with pytest.raises(ValueError, match="before the window"):
        h.prepend([], 5)
    with pytest.raises(ValueError, match="younger"):
        h.prepend([ev(4, t=2.0)], 3)  # would shield older events from expire
    assert [e.rv for e in h] == [6, 7] and h.oldest_rv == 5


def test_prepend_refuses_when_the_group_at_the_start_was_split_by_eviction():
    h = HistoryWindow(2, 300, oldest_rv=1)
    h.append(ev(2, name="a"))
    h.append(ev(2, name="b"))
    h.append(ev(2, name="c"))  # evicts the group at 2 so far...
    h.append(ev(2, name="d"))  # ...and the rest of it came after (an upstream tier's group, split by a read)
    assert h.oldest_rv == 2 and [e.rv for e in h] == [2]
    with pytest.raises(ValueError, match="partly evicted"):
        h.prepend([], 1)


def test_prepend_after_whole_groups_were_evicted_starts_the_window_over():
    h = HistoryWindow(2, 300, oldest_rv=1)
    h.max_events = 2
    for rv in (2, 3, 4):
        h.append(ev(rv))
    assert h.oldest_rv == 2 and h.evicted_at_oldest == 1
    h.max_events = 3  # room for the span
    h.prepend([ev(2)], 1)
    assert [e.rv for e in h] == [2, 3, 4] and h.oldest_rv == 1 and h.evicted_at_oldest == 0


def test_a_prepended_span_expires_with_the_head_it_was_stamped_with():
    h = HistoryWindow(10, 10.0, oldest_rv=5)
    h.append(ev(6, t=3.0))
    h.append(ev(7, t=8.0))
    h.prepend([ev(4, t=3.0)], 3)
    assert h.expire(now=13.5) == 2
    assert [e.rv for e in h] == [7] and h.oldest_rv == 6

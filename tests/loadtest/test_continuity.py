"""The watch-order checks the load test reports as failures (loadtest/locust/continuity.py), without locust."""

from __future__ import annotations

import pytest

from loadtest.locust.continuity import Continuity, StoreCheck


def test_events_in_order_with_shared_rv_pass() -> None:
    c = Continuity()
    c.start(10)
    assert c.event("ns/a", 11) is None
    assert c.event("ns/b", 11) is None  # two objects in one atomic change (or a relist diff)
    assert c.bookmark(11) is None
    assert c.event("ns/a", 12) is None
    assert c.resume_rv == 12


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        pytest.param([("event", "ns/a", 12), ("event", "ns/b", 11)], "went backwards", id="rv-backwards"),
        pytest.param([("event", "ns/a", 11), ("event", "ns/a", 11)], "duplicate", id="duplicate-name-rv"),
        pytest.param([("event", "ns/a", 10)], "not after the watch", id="event-at-start-rv"),
        pytest.param([("bookmark", "", 15), ("event", "ns/a", 14)], "not after the watch", id="event-behind-bookmark"),
        pytest.param([("event", "ns/a", 13), ("bookmark", "", 12)], "bookmark went backwards", id="bookmark-backwards"),
    ],
)
def test_gaps_and_duplicates_are_reported(steps: list[tuple[str, str, int]], problem: str) -> None:
    c = Continuity()
    c.start(10)
    found = [c.event(key, rv) if kind == "event" else c.bookmark(rv) for kind, key, rv in steps]
    assert found[:-1] == [None] * (len(found) - 1)
    assert found[-1] is not None and problem in found[-1]


def test_resuming_from_the_last_rv_rejects_a_replayed_event() -> None:
    c = Continuity()
    c.start(10)
    c.event("ns/a", 12)
    c.start(c.resume_rv)  # the stream ended; the client resumes from 12
    assert c.event("ns/a", 12) is not None
    assert c.event("ns/b", 13) is None


def test_reset_forgets_the_previous_stream() -> None:
    c = Continuity()
    c.start(50)
    c.event("ns/a", 51)
    c.reset()  # a relist after 410: the new list may be at any rv
    c.start(40)
    assert c.event("ns/a", 41) is None


def test_store_check_flags_events_that_contradict_the_informer() -> None:
    store = StoreCheck()
    store.replace({"ns/a"})
    assert store.event("MODIFIED", "ns/a") is None
    assert store.event("ADDED", "ns/b") is None
    assert store.event("DELETED", "ns/a") is None
    assert "never saw" in (store.event("MODIFIED", "ns/a") or "")
    assert "never saw" in (store.event("DELETED", "ns/c") or "")
    assert "already has" in (store.event("ADDED", "ns/b") or "")

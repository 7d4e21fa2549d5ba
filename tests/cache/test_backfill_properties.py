"""Property tests of backfill: the cache against a reference model of the upstream's whole history.

The model is the upstream: a log of every write since the start, so the state at any rv
and the events after any rv are known. The cache starts late (a proxy that restarted: a
list at the upstream's head, no history), then sees writes (groups of keys at one rv,
sometimes split across two batches), progress marks, relists after writes it never saw,
age and count evictions, and backfills from any rv, built as the proxy builds them: a full
list at R and the events after R. After every step, for every rv r in the window,
``snapshot(r)`` is the upstream's state at r and ``events_since(r)`` the upstream's events
after r (or 410 where r is shared by several events). A backfill is taken exactly when the
model says it can be (not across a relist, fits the window), and a span that was tampered
with is refused and changes nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject
from watchcache.cache.store import (
    BackfillRefused,
    CacheConfig,
    ResourceCache,
    ResourceVersionTooOld,
    Span,
)
from watchcache.resources import PODS

NAMES = [f"p{i}" for i in range(5)]
NAMESPACES = ["a", "b"]

write = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans())  # (ns, name, delete?)
group = st.lists(write, min_size=1, max_size=3, unique_by=lambda w: (w[0], w[1]))
single = st.lists(write, min_size=1, max_size=1)
step = st.one_of(
    st.tuples(st.just("write"), st.tuples(group, st.integers(0, 2))),
    st.tuples(st.just("write"), st.tuples(single, st.just(0))),
    st.tuples(st.just("progress"), st.integers(1, 3)),
    st.tuples(st.just("relist"), st.lists(single, max_size=3)),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 8.0, 25.0])),  # max_age is 20
    # backfill from head - back; tamper: 0 none, 1 drop an event, 2 a wrong rv in the list
    st.tuples(st.just("backfill"), st.tuples(st.integers(0, 40), st.integers(0, 2))),
)

Entry = tuple[int, str, str, int | None]  # (rv, type as the upstream sends it, key, object rv or None)


class Upstream:
    """The reference model: every write, from the first."""

    def __init__(self) -> None:
        self.rv = 1
        self.log: list[Entry] = []
        self.state: dict[str, int] = {}

    def commit(self, writes: list[tuple[str, str, bool]]) -> list[tuple[str, CachedObject]]:
        """One group of writes at the next rv (several keys at one rv: an upstream watch cache's group)."""
        self.rv += 1
        rv = self.rv
        changes: list[tuple[str, CachedObject]] = []
        for ns, name, delete in writes:
            key = f"{ns}/{name}"
            if delete and key in self.state:
                del self.state[key]
                self.log.append((rv, DELETED, key, None))
                changes.append((DELETED, pod(name, ns, rv)))
            else:
                kind = MODIFIED if key in self.state else ADDED
                self.state[key] = rv
                self.log.append((rv, kind, key, rv))
                changes.append((kind, pod(name, ns, rv)))
        return changes

    def at(self, rv: int) -> dict[str, int]:
        state: dict[str, int] = {}
        for erv, _, key, value in self.log:
            if erv > rv:
                break
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        return state

    def objects_at(self, rv: int) -> list[CachedObject]:
        return [pod(key.split("/")[1], key.split("/")[0], v) for key, v in self.at(rv).items()]

    def changes_after(self, rv: int) -> list[tuple[str, CachedObject]]:
        out = []
        for erv, kind, key, _ in self.log:
            if erv > rv:
                ns, name = key.split("/")
                out.append((kind, pod(name, ns, erv)))
        return out


def check_window(cache: ResourceCache, up: Upstream, continued: set[int]) -> None:
    history = cache.history
    stamps = [e.received for e in history]
    assert stamps == sorted(stamps), "arrival stamps out of order: expire would keep old events"
    rvs = [e.rv for e in history]
    assert rvs == sorted(rvs) and all(r > cache.oldest_rv for r in rvs)
    assert len(history) <= history.max_events
    assert history.bytes == sum(e.size for e in history)
    for r in range(cache.oldest_rv, cache.rv + 1):
        snap = cache.snapshot(r)
        assert {o.key: o.rv for o in snap.iter_range("", None)} == up.at(r), f"state at {r}"
        at_r = [key for erv, _, key, _ in up.log if erv == r]
        try:
            events = cache.events_since(r)
        except ResourceVersionTooOld:
            assert len(at_r) > 1 or r == cache.unresumable_rv or r in continued, f"410 at {r} ({at_r})"
            continue
        expected = []
        state = up.at(r)
        for erv, _, key, value in up.log:
            if erv <= r or erv > cache.rv:
                continue
            kind = DELETED if value is None else (MODIFIED if key in state else ADDED)
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
            expected.append((erv, kind, key))
        assert [(e.rv, e.type, e.object.key) for e in events] == expected, f"events after {r}"
        for e in events:  # each event's prev is the key's state just before it
            prev = up.at(e.rv - 1).get(e.object.key)
            assert (None if e.prev is None else e.prev.rv) == prev, f"prev of {e}"


def tamper(span: Span, how: int, oldest: int) -> Span | None:
    """A span that must be refused: an event dropped (the last one of its key up to oldest), or a wrong rv."""
    if how == 1:
        upto = [(i, obj) for i, (_, obj) in enumerate(span.changes) if obj.rv <= oldest]
        if not upto:
            return None
        index = upto[-1][0]
        changes = [c for i, c in enumerate(span.changes) if i != index]
        return Span(span.rv, span.through, changes, span.prior, span.others)
    if how == 2 and span.others:
        key = sorted(span.others)[0]
        others = {**span.others, key: span.others[key] + 1000}
        return Span(span.rv, span.through, span.changes, span.prior, others)
    return None


@settings(max_examples=400, deadline=None)
@given(
    before=st.lists(single, max_size=8),
    steps=st.lists(step, max_size=30),
    max_events=st.integers(2, 30),
)
def test_backfill_matches_the_upstreams_history(before, steps, max_events):
    up = Upstream()
    for writes in before:
        up.commit(writes)
    now = [0.0]
    # The proxy (re)started: a list at the upstream's head, no history.
    cache = ResourceCache(PODS, CacheConfig(history_max_events=max_events, history_max_age=20.0), lambda: now[0])
    cache.replace(up.objects_at(up.rv), up.rv)
    listed_at = up.rv
    continued: set[int] = set()
    relisted_at = 0
    for kind, arg in steps:
        if kind == "write":
            writes, split = arg
            changes = up.commit(writes)
            split = split if 0 < split < len(changes) else len(changes)
            cache.apply(changes[:split])
            if split < len(changes):
                cache.apply(changes[split:])
                continued.add(up.rv)
        elif kind == "progress":
            up.rv += arg
            cache.progress(up.rv)
        elif kind == "relist":  # writes the cache never saw, then a relist after the upstream's 410
            for writes in arg:
                up.commit(writes)
            up.rv += 1
            cache.relist(up.objects_at(up.rv), up.rv)
            relisted_at = up.rv
        elif kind == "tick":
            now[0] += arg
            cache.expire()
            assert all(now[0] - e.received <= 20.0 for e in cache.history)
        else:
            back, how = arg
            start = max(0, up.rv - back)
            oldest = cache.oldest_rv
            span = Span.from_list(start, up.objects_at(start), up.changes_after(start), up.rv)
            before_len, before_oldest = len(cache.history), oldest
            bad = tamper(span, how, oldest) if start < oldest else None
            if bad is not None:
                with pytest.raises(BackfillRefused):
                    cache.backfill(bad)
                assert (len(cache.history), cache.oldest_rv) == (before_len, before_oldest)
            needed = sum(1 for erv, _, _, _ in up.log if start < erv <= oldest)
            event(f"backfill: {'none' if start >= oldest else 'relist' if start < relisted_at else 'other'}")
            if start >= oldest:
                assert cache.backfill(span) == []
            elif start < relisted_at:
                with pytest.raises(BackfillRefused) as refused:
                    cache.backfill(span)
                assert refused.value.reason == BackfillRefused.RELIST
            elif cache.history.at(oldest):  # part of the group at the window's start was evicted
                with pytest.raises(BackfillRefused) as refused:
                    cache.backfill(span)
                assert refused.value.reason == BackfillRefused.SPLIT
            elif needed > max_events - before_len:
                with pytest.raises(BackfillRefused) as refused:
                    cache.backfill(span)
                assert refused.value.reason == BackfillRefused.ROOM
            else:
                events = cache.backfill(span)
                event(f"taken: {'empty' if not needed else 'events'}, tampered {bad is not None}")
                event(f"taken after an eviction: {before_oldest not in (listed_at, relisted_at)}")
                assert len(events) == needed
                assert cache.oldest_rv == start
            if cache.oldest_rv == before_oldest:
                assert len(cache.history) == before_len
        check_window(cache, up, continued)


def test_a_span_is_refused_when_the_cache_holds_an_object_the_upstream_did_not():
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([pod("a", "ns", 3), pod("ghost", "ns", 2)], 5)
    span = Span.from_list(2, [pod("a", "ns", 1)], [(MODIFIED, pod("a", "ns", 3))], 5)
    with pytest.raises(BackfillRefused) as refused:
        cache.backfill(span)
    assert refused.value.reason == BackfillRefused.MISMATCH
    assert "upstream had 1 objects, this cache 2" in str(refused.value)
    assert cache.oldest_rv == 5


def test_a_span_that_ends_before_the_window_is_refused():
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([pod("a", "ns", 3)], 5)
    span = Span.from_list(2, [pod("a", "ns", 1)], [(MODIFIED, pod("a", "ns", 3))], 4)
    with pytest.raises(BackfillRefused) as refused:
        cache.backfill(span)
    assert refused.value.reason == BackfillRefused.SHORT


def test_backfilled_events_carry_prev_for_selector_transitions():
    cache = ResourceCache(PODS, CacheConfig(), lambda: 7.0)
    cache.replace([pod("a", "ns", 4, labels={"app": "y"})], 6)
    listed = [pod("a", "ns", 2, labels={"app": "x"})]
    span = Span.from_list(3, listed, [(MODIFIED, pod("a", "ns", 4, labels={"app": "y"}))], 6)
    (event,) = cache.backfill(span)
    assert event.type == MODIFIED and event.prev is not None and event.prev.labels == {"app": "x"}
    assert event.received == 7.0  # the window was empty: stamped now
    from watchcache.cache.predicate import SelectionPredicate

    leaving = SelectionPredicate.parse(PODS, None, "app=x", "")
    assert leaving.concerns(event)
    assert [e.rv for e in cache.events_since(3, leaving)] == [4]


def test_a_backfill_into_an_empty_window_does_not_let_a_group_continue_at_the_listed_rv():
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([pod("a", "ns", 5)], 5)
    cache.backfill(Span.from_list(4, [], [(ADDED, pod("a", "ns", 5))], 5))
    assert cache.history.newest_rv == 5 == cache.rv
    assert not cache.continues_group()

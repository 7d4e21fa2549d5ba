"""Property tests: the cache against a naive reference model.

The model keeps every write in a log. For any rv the cache claims to hold, reading the
cache at rv must equal replaying the log up to rv; a watch from rv must yield exactly
the log entries after rv — or 410 when several entries share rv (a client holding rv
may have seen part of them); paging at rv with any limit must concatenate to the full list.

Writes come in groups (several keys at one rv, as an upstream watch cache sends them),
sometimes split across two batches (a network read ending inside a group). Relists hand
over the state after writes the cache never saw; their diff must bring any client from the
old state to the new one with rvs that never go backwards, and a client that got only part
of it must never be able to resume silently.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache, ResourceVersionTooOld
from watchcache.resources import PODS as PODS_T

NAMES = [f"p{i}" for i in range(6)]
NAMESPACES = ["a", "a-b", "b"]

write = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans())  # (ns, name, delete?)
group = st.lists(write, min_size=1, max_size=3, unique_by=lambda w: (w[0], w[1]))
step = st.one_of(
    # one group at one rv; split: how many of its changes arrive in a first batch (0: all in one)
    st.tuples(st.just("write"), st.tuples(group, st.integers(0, 2))),
    st.tuples(st.just("progress"), st.integers(1, 3)),
    # writes the cache never sees (groups at rvs spaced by 1 or 2), then a relist a little later
    st.tuples(
        st.just("relist"), st.tuples(st.lists(st.tuples(group, st.integers(1, 2)), max_size=4), st.integers(0, 2))
    ),
)

Log = list[tuple[int, str, str, object]]  # (rv, type, key, object rv or None)


def replay(log: Log, initial: dict, rv: int) -> dict:
    state = dict(initial)
    for erv, _, key, value in log:
        if erv > rv:
            break
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def as_changes(writes, state: dict, rv: int, log: Log | None) -> list[tuple[str, object]]:
    """The changes of one group at rv, applied to the model's state (and log)."""
    changes = []
    for ns, name, delete in writes:
        key = f"{ns}/{name}"
        if delete and key in state:
            changes.append((DELETED, pod(name, ns, rv)))
            if log is not None:
                log.append((rv, DELETED, key, None))
            del state[key]
        else:
            changes.append((MODIFIED, pod(name, ns, rv)))
            if log is not None:
                log.append((rv, MODIFIED if key in state else ADDED, key, rv))
            state[key] = rv
    return changes


def check_relist_diff(events: list[WatchEvent], before: dict, after: dict, old_rv: int, rv: int) -> None:
    """What clients see of a relist diff (each frame's object rv) is sound for every watch."""
    # Replaying the diff takes any client from the old state to the new one.
    state = dict(before)
    for e in events:
        if e.type == DELETED:
            del state[e.object.key]
        else:
            state[e.object.key] = e.object.rv
    assert state == after
    assert all(e.rv == rv for e in events)  # one group in the cache
    rvs = [e.object.rv for e in events]
    assert rvs == sorted(rvs) and all(old_rv < r <= rv for r in rvs), rvs
    at_rv = rvs.count(rv)
    own_at_rv = sum(1 for v in after.values() if v == rv)
    if rv > old_rv + 1 and own_at_rv <= 1:
        assert at_rv <= 1, f"several frames at {rv}: {rvs}"  # only the cases relist cannot order away
    if events:
        assert rvs[-1] == rv or (own_at_rv == 0 and not any(e.type == DELETED for e in events))


def check_no_silent_partial_resume(cache: ResourceCache, events: list[WatchEvent]) -> None:
    """A watch (any namespace) that got part of the diff cannot resume from the last rv it got."""
    rv = cache.rv
    for ns in [None, *NAMESPACES]:
        predicate = SelectionPredicate.parse(PODS_T, ns, "", "")
        seen = [e for e in events if predicate.concerns(e)]
        for i in range(1, len(seen)):  # the client got seen[:i]
            with pytest.raises(ResourceVersionTooOld):
                cache.events_since(seen[i - 1].object.rv, predicate)
        if seen and seen[-1].object.rv == rv and not cache.ambiguous(rv, predicate):
            assert cache.events_since(rv, predicate) == []  # got it all: resumes without 410


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=40), max_events=st.integers(1, 12), limit=st.integers(1, 4))
def test_cache_matches_reference_model(steps, max_events, limit):
    cache = ResourceCache(PODS_T, CacheConfig(history_max_events=max_events), lambda: 0.0)
    base = {"a/p0": 1, "b/p1": 1}  # the state at base_rv, where the log starts
    cache.replace([pod("p0", "a", 1), pod("p1", "b", 1)], 5)
    base_rv = rv = 5
    log: Log = []
    continued: set[int] = set()  # rvs whose group arrived in two batches
    state = dict(base)
    for kind, arg in steps:
        if kind == "progress":
            rv += arg
            cache.progress(rv)
            continue
        if kind == "relist":
            unseen, later = arg
            before, old_rv = dict(state), rv
            for writes, gap in unseen:
                rv += gap
                as_changes(writes, state, rv, None)
            rv += later
            listed = [pod(key.split("/")[1], key.split("/")[0], v) for key, v in state.items()]
            events = cache.relist(listed, rv)
            check_relist_diff(events, before, state, old_rv, rv)
            check_no_silent_partial_resume(cache, events)
            base, base_rv, log, continued = dict(state), rv, [], set()
            continue
        writes, split = arg
        rv += 1
        changes = as_changes(writes, state, rv, log)
        split = split if 0 < split < len(changes) else len(changes)
        cache.apply(changes[:split])
        if split < len(changes):  # the rest of the group, in the next batch
            cache.apply(changes[split:])
            continued.add(rv)

    assert cache.rv == rv
    for r in range(1, rv + 1):
        if r < cache.oldest_rv:
            try:
                cache.snapshot(r)
            except ResourceVersionTooOld:
                continue
            raise AssertionError(f"read at {r} before window start {cache.oldest_rv} succeeded")
        if r < base_rv:
            continue
        expected = replay(log, base, r)
        snap = cache.snapshot(r)
        got = {o.key: o.rv for o in snap.iter_range("", None)}
        assert got == expected, f"state at {r}"
        assert snap.count_range("", None) == len(expected)
        # paging at r concatenates to the full list, with consistent remaining counts
        start = None
        paged: list[str] = []
        while True:
            page = list_page(cache.snapshot(r), ListScope.of(None), None, limit=limit, start=start)
            paged.extend(o.key for o in page.items)
            if page.next_start is None:
                break
            assert page.remaining == len(expected) - len(paged)
            start = page.next_start
        assert paged == sorted(expected)
        # namespace scope at r
        for ns in NAMESPACES:
            in_ns = [o.key for o in list_page(cache.snapshot(r), ListScope.of(ns), None).items]
            assert in_ns == sorted(k for k in expected if k.startswith(ns + "/"))
        # watch from r = log entries after r, in order, with normalised types; 410 where r is
        # shared by several entries (for a namespaced watch: several in its namespace), or by a
        # group that arrived in two batches with any entry in the watch's namespace
        at_r = [key for erv, _, key, _ in log if erv == r]
        for ns in [None, *NAMESPACES]:
            predicate = None if ns is None else SelectionPredicate.parse(PODS_T, ns, "", "")
            concerning = [k for k in at_r if ns is None or k.startswith(ns + "/")]
            if r == cache.unresumable_rv:
                # a relist whose diff has several frames at r: refused, unless at most one of
                # those frames concerns the watch (checked in check_no_silent_partial_resume)
                concerning = [] if cache.ambiguous(r, predicate) else concerning
            try:
                events = cache.events_since(r, predicate)
            except ResourceVersionTooOld:
                # evicted events of the group at the window's start count for every watch
                ambiguous = len(concerning) > 1 or r == cache.unresumable_rv or (r in continued and concerning)
                assert ambiguous or (r == cache.oldest_rv and len(at_r) > 1), (r, ns, at_r)
                continue
            assert len(concerning) <= 1, f"resume at {r} shared by {concerning} served"
            assert not (r in continued and concerning), f"resume at {r}, a group that came in two batches, served"
            assert [(e.rv, e.type, e.object.key) for e in events] == [(erv, t, k) for erv, t, k, _ in log if erv > r]

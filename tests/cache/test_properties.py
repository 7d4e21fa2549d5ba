"""Property tests: the cache against a naive reference model.

The model keeps every write in a log. For any rv the cache claims to hold, reading the
cache at rv must equal replaying the log up to rv; a watch from rv must yield exactly
the log entries after rv; paging at rv with any limit must concatenate to the full list.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.store import CacheConfig, ResourceCache, ResourceVersionTooOld
from watchcache.resources import PODS as PODS_T

NAMES = [f"p{i}" for i in range(6)]
NAMESPACES = ["a", "a-b", "b"]

write = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans())  # (ns, name, delete?)
step = st.one_of(
    st.tuples(st.just("write"), st.lists(write, min_size=1, max_size=3, unique_by=lambda w: (w[0], w[1]))),
    st.tuples(st.just("progress"), st.integers(1, 3)),
)


def replay(log: list[tuple[int, str, str, object]], initial: dict, rv: int) -> dict:
    state = dict(initial)
    for erv, _, key, value in log:
        if erv > rv:
            break
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=40), max_events=st.integers(1, 12), limit=st.integers(1, 4))
def test_cache_matches_reference_model(steps, max_events, limit):
    cache = ResourceCache(PODS_T, CacheConfig(history_max_events=max_events), lambda: 0.0)
    initial = {"a/p0": 1, "b/p1": 1}
    cache.replace([pod("p0", "a", 1), pod("p1", "b", 1)], 5)
    rv = 5
    log: list[tuple[int, str, str, object]] = []  # (rv, type, key, value or None)
    state = dict(initial)
    for kind, arg in steps:
        if kind == "progress":
            rv += arg
            cache.progress(rv)
            continue
        rv += 1
        changes = []
        for ns, name, delete in arg:
            key = f"{ns}/{name}"
            if delete and key in state:
                changes.append((DELETED, pod(name, ns, rv)))
                log.append((rv, DELETED, key, None))
                del state[key]
            else:
                changes.append((MODIFIED, pod(name, ns, rv)))
                log.append((rv, MODIFIED if key in state else ADDED, key, rv))
                state[key] = rv
        cache.apply(changes)

    assert cache.rv == rv
    for r in range(1, rv + 1):
        if r < cache.oldest_rv:
            try:
                cache.snapshot(r)
            except ResourceVersionTooOld:
                continue
            raise AssertionError(f"read at {r} before window start {cache.oldest_rv} succeeded")
        if r < 5:
            continue
        expected = replay(log, initial, r)
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
        # watch from r = log entries after r, in order, with normalised types
        events = cache.events_since(r)
        assert [(e.rv, e.type, e.object.key) for e in events] == [(erv, t, k) for erv, t, k, _ in log if erv > r]

"""The scope proof's comparison against a reference model: equal iff the scope's objects and versions are.

The model is the plain definition: the cache's (key -> rv) within the scope, as of its snapshot's rv,
equals the upstream's listed (key -> rv). Both come from one history of writes, as they do in the
proxy: the cache has applied a prefix of it (its snapshot may be read back at an older rv) and the
upstream lists the scope after at least as much of it. When they differ, the rv asked for is the
highest listed version the cache lacks (0: only a deletion it has not applied).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.listing import ListScope
from watchcache.cache.object import object_key
from watchcache.cache.scopestate import ScopeState, missing_rv
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.resources import PODS

NAMESPACES = ["a", "a-b", "b"]
keys = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from([f"p{i}" for i in range(4)]))


def state_after(initial: dict[str, int], writes: list[tuple[str, bool, int]]) -> dict[str, int]:
    state = dict(initial)
    for key, delete, rv in writes:
        if delete:
            state.pop(key, None)
        else:
            state[key] = rv
    return state


@settings(max_examples=500, deadline=None)
@given(
    initial=st.dictionaries(keys, st.integers(1, 10), max_size=8),
    history=st.lists(st.tuples(keys, st.booleans()), max_size=8),
    data=st.data(),
    namespace=st.sampled_from([None, *NAMESPACES]),
)
def test_missing_rv_agrees_with_the_reference_model(
    initial: dict[tuple[str, str], int],
    history: list[tuple[tuple[str, str], bool]],
    data: st.DataObject,
    namespace: str | None,
) -> None:
    # One history after rv 10: deletions of absent objects dropped, each write one rv.
    at_10 = {object_key(ns, name): rv for (ns, name), rv in initial.items()}
    writes: list[tuple[str, bool, int]] = []
    live = dict(at_10)
    for (ns, name), delete in history:
        key = object_key(ns, name)
        if delete and key not in live:
            continue
        rv = 11 + len(writes)
        writes.append((key, delete, rv))
        live = state_after(live, [(key, delete, rv)])
    applied = data.draw(st.integers(0, len(writes)), label="writes the cache applied")
    read_at = data.draw(st.integers(0, applied), label="writes before the snapshot's rv")
    listed_after = data.draw(st.integers(read_at, len(writes)), label="writes before the upstream's listing")

    cache = ResourceCache(PODS, CacheConfig(history_max_events=100), lambda: 0.0)
    cache.replace([pod(name, ns=ns, rv=rv) for (ns, name), rv in initial.items()], 10)
    seen = dict(at_10)
    for key, delete, rv in writes[:applied]:
        ns, name = key.split("/")
        kind = DELETED if delete else (MODIFIED if key in seen else ADDED)
        cache.apply([(kind, pod(name, ns=ns, rv=rv))])
        seen = state_after(seen, [(key, delete, rv)])
    snapshot = cache.snapshot(10 + read_at)
    assert snapshot.rv == 10 + read_at

    def in_scope(state: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in state.items() if namespace is None or k.startswith(namespace + "/")}

    cached = in_scope(state_after(at_10, writes[:read_at]))
    listed = in_scope(state_after(at_10, writes[:listed_after]))
    state = ScopeState(10 + listed_after, len(listed), max(listed.values(), default=0))

    got = missing_rv(snapshot, ListScope.of(namespace), state)
    if cached == listed:
        assert got is None
    else:
        lacking = [v for k, v in listed.items() if k not in cached or cached[k] < v]
        assert got == max(lacking, default=0)

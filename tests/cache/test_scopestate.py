"""The scope proof's comparison against a reference model: equal iff the scope's objects and versions are.

The model is the plain definition: the cache's (key -> rv) within the scope, with its overlay
of undone keys applied (a snapshot at an older rv), equals the upstream's listed (key -> rv).
When they differ, the rv asked for is the highest listed version the cache lacks.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import pod
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.listing import ListScope
from watchcache.cache.object import object_key
from watchcache.cache.scopestate import ScopeState, missing_rv
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.resources import PODS

NAMESPACES = ["a", "a-b", "b"]
keys = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from([f"p{i}" for i in range(4)]))
states = st.dictionaries(keys, st.integers(1, 6), max_size=8)


@settings(max_examples=400, deadline=None)
@given(
    cached=states,
    later=st.lists(st.tuples(keys, st.booleans()), max_size=4),
    upstream=states,
    namespace=st.sampled_from([None, *NAMESPACES]),
    read_back=st.booleans(),
)
def test_missing_rv_agrees_with_the_reference_model(
    cached: dict[tuple[str, str], int],
    later: list[tuple[tuple[str, str], bool]],
    upstream: dict[tuple[str, str], int],
    namespace: str | None,
    read_back: bool,
) -> None:
    cache = ResourceCache(PODS, CacheConfig(history_max_events=100), lambda: 0.0)
    cache.replace([pod(name, ns=ns, rv=rv) for (ns, name), rv in cached.items()], 10)
    model = {object_key(ns, name): rv for (ns, name), rv in cached.items()}
    at_10 = dict(model)
    rv = 10
    for (ns, name), delete in later:  # writes after rv 10 (a snapshot read back at 10 overlays them)
        rv += 1
        key = object_key(ns, name)
        if delete and key not in model:
            continue
        cache.apply([(DELETED if delete else MODIFIED, pod(name, ns=ns, rv=rv))])
        if delete:
            del model[key]
        else:
            model[key] = rv
    snapshot = cache.snapshot(10) if read_back else cache.snapshot()
    seen = at_10 if read_back else model
    scope = ListScope.of(namespace)
    listed = {object_key(ns, name): v for (ns, name), v in upstream.items() if namespace is None or ns == namespace}
    state = ScopeState(1000, listed)

    in_scope = {k: v for k, v in seen.items() if namespace is None or k.startswith(namespace + "/")}
    got = missing_rv(snapshot, scope, state)
    if in_scope == listed:
        assert got is None
    else:
        lacking = [v for k, v in listed.items() if k not in in_scope or in_scope[k] < v]
        assert got == max(lacking, default=0)

"""The trigger-field index of LISTs (pods by spec.nodeName, as kube's cacher Indexers).

A LIST that pins the index field reads the index's keys instead of scanning every object; it
must answer exactly what the scan answers (which test_properties.py checks against a model), at
the current rv and at every older rv in the window, in every scope, on every page.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import configmap, pod
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.listing import ListScope, candidates, list_page
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.resources import CONFIGMAPS, PODS

NODES = ["", "n1", "n2"]
NAMES = [f"p{i}" for i in range(5)]
NAMESPACES = ["a", "b"]

change = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.sampled_from([*NODES, None]))
step = st.one_of(
    st.tuples(st.just("apply"), st.lists(change, min_size=1, max_size=3, unique_by=lambda c: (c[0], c[1]))),
    st.tuples(st.just("relist"), st.lists(change, max_size=6, unique_by=lambda c: (c[0], c[1]))),
)


def by_scan(cache: ResourceCache, rv: int, scope: ListScope, node: str, limit: int) -> list[list[str]]:
    return pages(cache, rv, scope, node, limit, indexed=False)


def pages(cache: ResourceCache, rv: int, scope: ListScope, node: str, limit: int, *, indexed: bool) -> list[list[str]]:
    predicate = SelectionPredicate.parse(PODS, None, "", f"spec.nodeName={node}")
    out, start = [], None
    while True:
        snapshot = cache.snapshot(rv)
        value = predicate.exact_field(snapshot.index_field) if indexed else None
        page = list_page(snapshot, scope, predicate.selector_matches, limit=limit, start=start, indexed=value)
        out.append([o.key for o in page.items])
        if page.next_start is None:
            return out
        start = page.next_start


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(step, max_size=25), limit=st.integers(0, 3))
def test_an_indexed_list_answers_what_a_scan_answers_at_every_rv(steps, limit):
    cache = ResourceCache(PODS, CacheConfig(history_max_events=8), lambda: 0.0)
    cache.replace([pod("p0", "a", 1, node="n1"), pod("p1", "b", 1, node="n2")], 1)
    rv = 1
    state = {"a/p0": "n1", "b/p1": "n2"}
    for kind, changes in steps:
        rv += 1
        if kind == "relist":
            state = {f"{ns}/{name}": node for ns, name, node in changes if node is not None}
            cache.relist([pod(k.split("/")[1], k.split("/")[0], rv, node=n) for k, n in state.items()], rv)
            continue
        batch = []
        for ns, name, node in changes:
            key = f"{ns}/{name}"
            if node is None:
                if key in state:
                    batch.append((DELETED, pod(name, ns, rv, node=state.pop(key))))
            else:
                batch.append((MODIFIED, pod(name, ns, rv, node=node)))
                state[key] = node
        if batch:
            cache.apply(batch)
        else:
            cache.progress(rv)
    assert cache.index_field == "spec.nodeName"
    for r in range(cache.oldest_rv, cache.rv + 1):
        for scope in (ListScope.of(None), *(ListScope.of(ns) for ns in NAMESPACES)):
            for node in NODES:
                indexed = pages(cache, r, scope, node, limit, indexed=True)
                assert indexed == by_scan(cache, r, scope, node, limit), (r, scope, node)
    for node in NODES:  # and the current state is the model's
        want = sorted(k for k, n in state.items() if n == node)
        assert [k for page in pages(cache, cache.rv, ListScope.of(None), node, 0, indexed=True) for k in page] == want


def test_the_index_forgets_values_no_object_has_any_more() -> None:
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([pod("p0", "a", 1, node="n1")], 1)
    cache.apply([(MODIFIED, pod("p0", "a", 2, node="n2"))])
    cache.apply([(DELETED, pod("p0", "a", 3, node="n2"))])
    assert cache.snapshot().keys_with("n1") == cache.snapshot().keys_with("n2") == []
    assert cache._index == {}


def test_a_resource_whose_trigger_is_its_name_has_no_index() -> None:
    # metadata.name is the key itself: a name lookup needs no index (dispatch/lists.py reads the key).
    cache = ResourceCache(CONFIGMAPS, CacheConfig(), lambda: 0.0)
    cache.replace([configmap("c", "a", 1)], 1)
    assert cache.index_field is None
    assert cache._index == {}


selector = st.tuples(
    st.sampled_from([None, *NAMESPACES]),
    st.sampled_from(
        ["", *(f"spec.nodeName={n}" for n in NODES), "metadata.name=p1", "metadata.name=p1,spec.nodeName=n1"]
    ),
)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(step, max_size=15), selectors=st.lists(selector, min_size=1, max_size=6))
def test_a_watchs_initial_state_reads_only_candidates_and_finds_what_a_scan_finds(steps, selectors):
    cache = ResourceCache(PODS, CacheConfig(history_max_events=8), lambda: 0.0)
    cache.replace([pod("p0", "a", 1, node="n1"), pod("p1", "b", 1, node="n2")], 1)
    rv = 1
    for kind, changes in steps:
        rv += 1
        live = list(cache.snapshot().iter_range("", None))
        if kind == "relist":
            cache.relist([pod(name, ns, rv, node=node) for ns, name, node in changes if node is not None], rv)
            continue
        keys = {o.key for o in live}
        batch = [
            (DELETED if node is None else MODIFIED, pod(name, ns, rv, node=node or ""))
            for ns, name, node in changes
            if node is not None or f"{ns}/{name}" in keys
        ]
        if batch:
            cache.apply(batch)
        else:
            cache.progress(rv)
    for r in (cache.oldest_rv, cache.rv):
        snapshot = cache.snapshot(r)
        for namespace, fields in selectors:
            predicate = SelectionPredicate.parse(PODS, namespace, "", fields)
            found = [o.key for o in candidates(snapshot, predicate, namespaced=True) if predicate.matches(o)]
            assert found == [o.key for o in snapshot.iter_range("", None) if predicate.matches(o)], (
                r,
                namespace,
                fields,
            )


def test_a_watch_of_one_named_object_in_a_namespace_reads_one_key() -> None:
    cache = ResourceCache(CONFIGMAPS, CacheConfig(), lambda: 0.0)
    cache.replace([configmap(f"c{i}", ns, 1) for i in range(50) for ns in NAMESPACES], 1)
    predicate = SelectionPredicate.parse(CONFIGMAPS, "b", "", "metadata.name=c7")
    assert [o.key for o in candidates(cache.snapshot(), predicate, namespaced=True)] == ["b/c7"]

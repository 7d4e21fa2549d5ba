"""shardSelector in the cache: the predicate, paging with kube's counts, the hash kept per object,
and the property the issue sets (N shards are disjoint and their union is the full LIST, at every
resourceVersion, with paging), against the store with history and relists."""

from __future__ import annotations

import itertools
import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.object import CachedObject, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.shardhash import _scan_uid, in_shard, object_uid, uid_hash
from watchcache.cache.store import CacheConfig, ResourceCache, ResourceVersionTooOld
from watchcache.resources import CONFIGMAPS, NODES
from watchcache.selectors.shards import HASH_SPACE, fnv1a_64, parse_shard_selector


def cm(
    name: str, ns: str = "a", rv: int = 1, *, uid: str | None = None, labels: dict[str, str] | None = None
) -> CachedObject:
    meta = {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels or {}}
    meta["uid"] = uid if uid is not None else str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{ns}/{name}"))
    return encode_object(CONFIGMAPS, {"metadata": meta, "data": {"k": str(rv)}})


def hex16(value: int) -> str:
    return "0x10000000000000000" if value == HASH_SPACE else f"0x{value:016x}"


def shard_selectors(n: int, field: str = "uid") -> list[str]:
    """The selectors of N equal shards of the hash space."""
    bounds = [i * HASH_SPACE // n for i in range(n + 1)]
    return [
        f"shardRange(object.metadata.{field}, '{hex16(lo)}', '{hex16(hi)}')" for lo, hi in itertools.pairwise(bounds)
    ]


def predicate(shard: str, *, labels: str = "", namespace: str | None = None) -> SelectionPredicate:
    return SelectionPredicate.parse(CONFIGMAPS, namespace, labels, "", shard)


def test_predicate_selects_by_the_uid_hash() -> None:
    low, high = shard_selectors(2)
    objs = [cm(f"c{i}") for i in range(40)]
    lows = [o for o in objs if predicate(low).matches(o)]
    highs = [o for o in objs if predicate(high).matches(o)]
    assert lows and highs and len(lows) + len(highs) == len(objs)
    assert all(fnv1a_64(object_uid(o)) < 1 << 63 for o in lows)
    assert not predicate(low).selects_all and predicate(low).filters and predicate(low).empty


def test_namespace_shards_keep_each_namespace_whole() -> None:
    objs = [cm(f"c{i}", ns) for ns in ("a", "b", "c", "d", "e") for i in range(3)]
    for sel in shard_selectors(2, "namespace"):
        chosen = {o.namespace for o in objs if predicate(sel).matches(o)}
        assert all(predicate(sel).matches(o) == (o.namespace in chosen) for o in objs)


def test_cluster_scoped_objects_hash_an_empty_namespace() -> None:
    node = encode_object(NODES, {"metadata": {"name": "n1", "resourceVersion": "1", "uid": "u"}})
    sel = parse_shard_selector(shard_selectors(1, "namespace")[0])
    assert in_shard(sel, node)  # [0, 2^64) holds fnv("") like every hash


def test_shard_and_label_selectors_both_apply() -> None:
    objs = [cm(f"c{i}", labels={"app": "x" if i % 2 else "y"}) for i in range(30)]
    low = shard_selectors(2)[0]
    both = predicate(low, labels="app=x")
    assert [o.name for o in objs if both.matches(o)] == [
        o.name for o in objs if predicate(low).matches(o) and o.labels["app"] == "x"
    ]
    assert not both.empty


def test_a_sharded_page_reports_kubes_unfiltered_remaining_count() -> None:
    """kube v1.36 (seen on a live apiserver): 6 ConfigMaps, 3 in shard 0, limit=1 gave
    remainingItemCount 5, the objects after the page's start minus the limit, not the matches left."""
    cache = ResourceCache(CONFIGMAPS, CacheConfig(), lambda: 0.0)
    objs = sorted((cm(f"c{i:02}") for i in range(12)), key=lambda o: o.key)
    cache.replace(objs, 20)
    low = predicate(shard_selectors(2)[0])
    scope = ListScope.of(None)
    page = list_page(cache.snapshot(), scope, low.selector_matches, limit=2, count_rest=True)
    assert page.next_start is not None
    assert page.remaining == 12 - 2
    start_index = next(i for i, o in enumerate(objs) if o.key == page.items[-1].key) + 1
    page2 = list_page(cache.snapshot(), scope, low.selector_matches, limit=1, start=page.next_start, count_rest=True)
    if page2.next_start is not None:
        assert page2.remaining == (12 - start_index) - 1
    # With a label selector too, kube reports no count.
    both = predicate(shard_selectors(2)[0], labels="x!=y")
    assert list_page(cache.snapshot(), scope, both.selector_matches, limit=1).remaining is None


def test_the_uid_hash_is_computed_on_first_use_once_per_object_version() -> None:
    cache = ResourceCache(CONFIGMAPS, CacheConfig(), lambda: 0.0)
    first = cm("c", rv=2)
    cache.replace([first], 2)
    assert first.uid_hash is None  # nothing hashed at ingest
    assert predicate(shard_selectors(1)[0]).matches(first)
    h = first.uid_hash
    assert h == fnv1a_64(str(uuid.uuid5(uuid.NAMESPACE_DNS, "a/c")))
    first.uid_hash = h ^ 1  # the memo is what later reads use
    assert uid_hash(first) == h ^ 1
    assert first.with_resource_version(9).uid_hash == h ^ 1  # a selector-leave copy keeps it


def body(meta: dict[str, object], **rest: object) -> CachedObject:
    raw = orjson.dumps({"metadata": meta, **rest})[1:]
    return CachedObject("a/x", "a", "x", 1, {}, {}, raw)


@pytest.mark.parametrize(
    ("meta", "rest", "expected"),
    [
        # kube's order for built-in kinds: found by the scan
        ({"name": "x", "generateName": "x-", "namespace": "a", "uid": "u-1", "resourceVersion": "1"}, {}, "u-1"),
        # a custom resource's sorted keys: ownerReferences (with a uid) before metadata.uid
        ({"labels": {"uid": "no"}, "ownerReferences": [{"uid": "owner"}], "uid": "u-2"}, {}, "u-2"),
        # a value that spells the key, escaped
        ({"name": "x", "annotations": {"a": '"uid":"no"'}, "uid": "u-3"}, {}, "u-3"),
        # no metadata.uid, one further on
        ({"name": "x"}, {"spec": {"uid": "no"}}, ""),
        ({"name": "x"}, {"uid": "no"}, ""),
    ],
    ids=["typed", "sorted-keys", "escaped-value", "nested-later", "top-level-later"],
)
def test_object_uid_is_metadata_uid_only(meta: dict[str, object], rest: dict[str, object], expected: str) -> None:
    assert object_uid(body(meta, **rest)) == expected


def test_the_scan_finds_a_typed_objects_uid_without_parsing() -> None:
    meta = {"name": "x", "namespace": "a", "uid": "u-1", "resourceVersion": "1", "labels": {"a": "b"}}
    assert _scan_uid(body(meta).body) == "u-1"
    assert _scan_uid(body({"labels": {}, "uid": "u"}).body) is None  # left to the parse


NAMES = [f"c{i}" for i in range(8)]
NS = ["a", "b", "c"]
write = st.tuples(st.sampled_from(NS), st.sampled_from(NAMES), st.booleans(), st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(
    writes=st.lists(st.lists(write, min_size=1, max_size=3), max_size=25),
    n=st.integers(1, 5),
    field=st.sampled_from(["uid", "namespace"]),
    limit=st.integers(0, 4),
    relist_at=st.integers(0, 25),
    scope_ns=st.sampled_from([None, "a", "b"]),
)
def test_n_shards_are_disjoint_and_cover_the_full_list_at_every_rv(writes, n, field, limit, relist_at, scope_ns):
    """At every rv the window holds, with any page size: each object of the full LIST is in exactly
    one of the N shards' paged LISTs, in the full LIST's order, and nothing else is."""
    cache = ResourceCache(CONFIGMAPS, CacheConfig(history_max_events=1000), lambda: 0.0)
    cache.replace([cm("c0", "a", 1), cm("c1", "b", 1)], 1)
    state = {"a/c0": cm("c0", "a", 1), "b/c1": cm("c1", "b", 1)}
    rv = 1
    for i, group in enumerate(writes):
        rv += 1
        changes = []
        for ns, name, delete, generation in {(w[0], w[1]): w for w in group}.values():
            key = f"{ns}/{name}"
            if delete and key in state:
                changes.append((DELETED, cm(name, ns, rv, uid=object_uid(state.pop(key)))))
            else:
                # generation: a recreated object gets a new uid (and so may move shard)
                uid = object_uid(state[key]) if key in state else f"{key}-{generation}-{rv}"
                state[key] = cm(name, ns, rv, uid=uid)
                changes.append((MODIFIED, state[key]))
        if i == relist_at:
            cache.relist(list(state.values()), rv)
        else:
            cache.apply(changes)
    selectors = [predicate(s) for s in shard_selectors(n, field)]
    scope = ListScope.of(scope_ns)
    for r in range(1, rv + 1):
        try:
            full = [o.key for o in list_page(cache.snapshot(r), scope, None).items]
        except ResourceVersionTooOld:
            continue
        seen: list[str] = []
        for sel in selectors:
            start, keys = None, []
            while True:
                page = list_page(
                    cache.snapshot(r), scope, sel.selector_matches, limit=limit, start=start, count_rest=True
                )
                keys.extend(o.key for o in page.items)
                assert all(sel.matches(o) for o in page.items)
                if page.next_start is None:
                    break
                assert page.remaining is not None and page.remaining >= 0
                start = page.next_start
            assert keys == sorted(keys)
            seen.extend(keys)
        assert sorted(seen) == full, f"rv {r}: shards {sorted(seen)} != full {full}"
        assert len(set(seen)) == len(seen), f"rv {r}: an object in two shards"

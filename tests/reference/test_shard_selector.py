"""shardSelector through watchcache against kube-apiserver v1.36 with ShardedListAndWatch on (reference tier).

The kit must run with the gate on (``KUBE_REFERENCE_FEATURE_GATES=ShardedListAndWatch=true``,
see shared/tools/kube-reference/README.md); against one without it every test here skips,
saying so. For ConfigMaps (a typed list) and a custom resource (an unstructured one), at the
resourceVersion kube answered (``resourceVersionMatch=Exact``: the same snapshot):

- each shard's LIST, page by page, has kube's items, resourceVersion, remainingItemCount and
  shardInfo, for uid and namespace shards and ``||`` of ranges;
- Tables and PartialObjectMetadataList carry kube's rows/items and, like kube's, no shardInfo;
- every malformed selector gets kube's answer (code, reason, message), on a LIST and a WATCH;
- a sharded watch carries the events kube's carries, and its initial events are kube's.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.kube.kit import (
    DEFAULT_RESOURCES,
    Api,
    ApiError,
    KubeEnv,
    Serving,
    drop_namespace,
    needs_kube,
    start_proxy,
    wait_for,
    with_query,
)
from harness.processes import Proc
from watchcache.selectors.shards import HASH_SPACE, fnv1a_64

pytestmark = [pytest.mark.reference, needs_kube]

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
NS = f"{os.environ.get('WATCHCACHE_REFERENCE_PREFIX', 'reference-shards')}-{_WORKER}"
GROUP = "shardsref.example.com"
CRD = f"widgets.{GROUP}"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/widgets"
NO_GATE = (
    "kube-apiserver does not serve shardSelector (ShardedListAndWatch is off): start the kit with "
    "KUBE_REFERENCE_FEATURE_GATES=ShardedListAndWatch=true"
)


def hex16(value: int) -> str:
    return "0x10000000000000000" if value == HASH_SPACE else f"0x{value:016x}"


def shards(n: int, field: str = "uid") -> list[str]:
    bounds = [i * HASH_SPACE // n for i in range(n + 1)]
    return [f"shardRange(object.metadata.{field}, '{hex16(a)}', '{hex16(b)}')" for a, b in itertools.pairwise(bounds)]


SELECTORS = [
    *shards(2),
    *shards(3),
    shards(2, "namespace")[0],
    # Two ranges, written loosely: kube echoes its normalized form.
    "  shardRange(object.metadata.uid,'0x0000000000000000','0x4000000000000000') || "
    "(shardRange( object.metadata.uid, \"0xc000000000000000\", '0x10000000000000000'))",
]
U = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
MALFORMED = [
    " ",
    "x",
    "1",
    "object.metadata.uid",
    "foo(1)",
    "!" + U,
    "!!" + U,
    "x." + U,
    f"{U} && {U}",
    f"{U} ? 1 : 2",
    f"[{U}]",
    "a{b: 1}",
    "if",
    "shardRange(",
    f"{U[:-1]},)",
    "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
    "shardRange(object['metadata'].uid, '0x0000000000000000', '0x8000000000000000')",
    "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
    "shardRange(object.metadata.uid, 0, '0x8000000000000000')",
    "shardRange(object.metadata.uid, 1u, '0x8000000000000000')",
    "shardRange(object.metadata.uid, null, '0x8000000000000000')",
    "shardRange(object.metadata.uid, b'0x0000000000000000', '0x8000000000000000')",
    "shardRange(object.metadata.uid, '0X0000000000000000', '0x8000000000000000')",
    "shardRange(object.metadata.uid, '0x000000000000000000', '0x8000000000000000')",
    "shardRange(object.metadata.uid, '0xABCDEF0000000000', '0x8000000000000000')",
    "shardRange(object.metadata.uid, '0x10000000000000001', '0x10000000000000000')",
    "shardRange(object.metadata.uid, '0x8000000000000000', '0x0000000000000000')",
    "shardRange(object.metadata.uid, '0x0000000000000000')",
    f"{U} || shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')",
]


@dataclass
class Ref:
    kube: KubeEnv
    direct: Api
    proxy: Api
    proc: Proc


def _crd() -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": GROUP,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def _served(api: Api, path: str) -> bool:
    try:
        api.get(path, limit=1)
    except ApiError as e:
        if e.status in (404, 429, 503):  # not yet: discovery, or kube's cache initializing
            return False
        raise
    return True


def _supports_sharding(api: Api) -> bool:
    body = api.get("/api/v1/namespaces/default/configmaps", limit=1, shardSelector=U)
    return "shardInfo" in body["metadata"]


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ref]:
    kube = KubeEnv.from_environ()
    direct = Api(kube.url, kube.token, kube.ca)
    if not _supports_sharding(direct):
        pytest.skip(NO_GATE)
    drop_namespace(direct, NS, ("configmaps", f"/apis/{GROUP}/v1/namespaces/{{ns}}/widgets"))
    direct.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    if not direct.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}"):
        direct.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", _crd())
    wait_for(lambda: _served(direct, f"/apis/{GROUP}/v1/widgets"), 30, "the CRD served")
    for i in range(40):
        direct.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:02}"}})
    for i in range(16):
        direct.create(WIDGETS, {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": f"w-{i:02}"}})
    serving = Serving.make(Path(tmp_path_factory.mktemp("serving")))
    proc = start_proxy(kube, serving, resources=f"{DEFAULT_RESOURCES},{GROUP}/v1/widgets")
    proxy = Api(proc.url, kube.token, str(serving.ca.crt))
    try:
        yield Ref(kube, direct, proxy, proc)
    finally:
        proxy.close()
        proc.stop()
        drop_namespace(direct, NS, ("configmaps", f"/apis/{GROUP}/v1/namespaces/{{ns}}/widgets"))
        direct.close()


def _pages(api: Api, path: str, limit: int, selector: str, rv: str | None) -> list[dict[str, Any]]:
    """Every page, as client-go pages: the selector on every page, the rv on the first."""
    out: list[dict[str, Any]] = []
    cont = None
    while True:
        if cont:
            body = api.get(path, limit=limit, shardSelector=selector, **{"continue": cont})
        elif rv is None:
            body = api.get(path, limit=limit or None, shardSelector=selector)
        else:
            body = api.get(path, limit=limit or None, shardSelector=selector, resourceVersion=rv,
                           resourceVersionMatch="Exact")  # fmt: skip
        out.append(body)
        cont = body["metadata"].get("continue")
        if not cont:
            return out


def _comparable(page: dict[str, Any]) -> tuple[Any, ...]:
    meta = dict(page["metadata"])
    has_continue = bool(meta.pop("continue", None))  # tokens are each server's own
    items = [(o["metadata"]["name"], o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for o in page["items"]]
    return page["kind"], meta, has_continue, items


@pytest.mark.parametrize("path", [CONFIGMAPS, WIDGETS], ids=["typed", "custom"])
@pytest.mark.parametrize("limit", [0, 1, 6])
@pytest.mark.parametrize("selector", SELECTORS, ids=[f"sel{i}" for i in range(len(SELECTORS))])
def test_sharded_lists_page_by_page_are_kubes(ref: Ref, path: str, limit: int, selector: str) -> None:
    direct = _pages(ref.direct, path, limit, selector, None)
    rv = direct[0]["metadata"]["resourceVersion"]
    proxied = _pages(ref.proxy, path, limit, selector, rv)
    assert [_comparable(p) for p in proxied] == [_comparable(p) for p in direct]


def test_shards_partition_kubes_full_list(ref: Ref) -> None:
    full = ref.direct.get(CONFIGMAPS)
    rv = full["metadata"]["resourceVersion"]
    names: list[str] = []
    for selector in shards(3):
        names += [o["metadata"]["name"] for p in _pages(ref.proxy, CONFIGMAPS, 4, selector, rv) for o in p["items"]]
    assert sorted(names) == [o["metadata"]["name"] for o in full["items"]]


@pytest.mark.parametrize("accept", ["Table", "PartialObjectMetadataList"])
def test_tables_and_metadata_lists_are_kubes(ref: Ref, accept: str) -> None:
    header = f"application/json;as={accept};v=v1;g=meta.k8s.io"
    selector = shards(2)[1]

    def answer(api: Api, **rv: str) -> dict[str, Any]:
        status, _, raw = api.raw("GET", with_query(CONFIGMAPS, shardSelector=selector, **rv), accept=header)
        assert status == 200, raw[:300]
        return json.loads(raw)

    direct = answer(ref.direct)
    proxied = answer(ref.proxy, resourceVersion=direct["metadata"]["resourceVersion"], resourceVersionMatch="Exact")
    assert proxied["metadata"] == direct["metadata"] and "shardInfo" not in direct["metadata"]
    key = "rows" if accept == "Table" else "items"

    def names(doc: dict[str, Any]) -> list[str]:
        return [(r.get("object") or r)["metadata"]["name"] for r in doc[key]]

    assert names(proxied) == names(direct) and names(direct)


def _error(api: Api, path: str) -> tuple[int, Any]:
    """(status, the Status body); a 200 watch's stream is not compared here."""
    status, _, raw = api.raw("GET", path)
    return status, (json.loads(raw) if status != 200 else None)


@pytest.mark.parametrize("selector", MALFORMED)
@pytest.mark.parametrize("watch", [False, True])
def test_malformed_selectors_get_kubes_answer(ref: Ref, selector: str, watch: bool) -> None:
    path = with_query(CONFIGMAPS, shardSelector=selector, watch=watch or None, timeoutSeconds=1 if watch else None)
    direct = _error(ref.direct, path)
    proxied = _error(ref.proxy, path)
    if direct[0] == 200 and watch:  # accepted: a watch stream, compared elsewhere
        assert proxied[0] == 200
        return
    assert proxied == direct


class Stream:
    """A watch's JSON lines, read with a deadline."""

    def __init__(self, api: Api, path: str, accept: str = "application/json") -> None:
        self.conn = api.connect(timeout=10)
        self.conn.request("GET", path, headers=api.headers(accept))
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()[:300]

    def until(self, stop: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        events = []
        while True:
            assert time.monotonic() < deadline, (
                f"no end event: {[(e['type'], e['object']['metadata'].get('name')) for e in events]}"
            )
            try:
                line = self.resp.readline()
            except TimeoutError:
                continue
            assert line, "the watch ended"
            event = json.loads(line)
            events.append(event)
            if stop(event):
                return events

    def close(self) -> None:
        self.conn.close()


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [
        (e["type"], e["object"]["metadata"].get("name"), e["object"]["metadata"]["resourceVersion"]) for e in events
    ]


def test_sharded_watches_carry_kubes_events(ref: Ref) -> None:
    rv = ref.direct.get(CONFIGMAPS, limit=1)["metadata"]["resourceVersion"]
    selector = shards(2)[0]
    path = with_query(CONFIGMAPS, watch=True, shardSelector=selector, resourceVersion=rv)
    streams = [Stream(ref.direct, path), Stream(ref.proxy, path)]
    try:
        made = []
        # Until one lands in the shard (each does with probability 1/2).
        while not any(fnv1a_64(o["metadata"]["uid"]) < 1 << 63 for o in made):
            assert len(made) < 64
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"w-{len(made)}"}}
            made.append(ref.direct.create(CONFIGMAPS, body))
        for obj in made:
            ref.direct.merge_patch(f"{CONFIGMAPS}/{obj['metadata']['name']}", {"data": {"k": "v"}})
            ref.direct.delete(f"{CONFIGMAPS}/{obj['metadata']['name']}")
        last = [o["metadata"]["name"] for o in made if fnv1a_64(o["metadata"]["uid"]) < 1 << 63][-1]

        def end(e: dict[str, Any]) -> bool:
            return e["type"] == "DELETED" and e["object"]["metadata"]["name"] == last

        direct, proxied = (_summary(s.until(end)) for s in streams)
        assert proxied == direct
        assert {name for _, name, _ in direct} == {
            o["metadata"]["name"] for o in made if fnv1a_64(o["metadata"]["uid"]) < 1 << 63
        }
    finally:
        for s in streams:
            s.close()


@pytest.mark.parametrize(
    "accept", ["application/json", "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"], ids=["full", "meta"]
)
def test_initial_events_are_kubes(ref: Ref, accept: str) -> None:
    selector = shards(2)[1]
    path = with_query(CONFIGMAPS, watch=True, shardSelector=selector, sendInitialEvents=True,
                      resourceVersionMatch="NotOlderThan", allowWatchBookmarks=True)  # fmt: skip

    def initial(api: Api) -> tuple[list[str], dict[str, Any]]:
        stream = Stream(api, path, accept)
        try:
            events = stream.until(lambda e: e["type"] == "BOOKMARK")
        finally:
            stream.close()
        kinds = {e["object"]["kind"] for e in events}
        assert len(kinds) == 1, kinds  # ConfigMap, or PartialObjectMetadata for every frame
        return sorted(e["object"]["metadata"]["name"] for e in events[:-1]), events[-1]["object"]["metadata"]

    d_names, d_meta = initial(ref.direct)
    p_names, p_meta = initial(ref.proxy)
    assert p_names == d_names and d_names
    assert p_meta["annotations"] == d_meta["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_the_proxy_answered_from_its_cache(ref: Ref) -> None:
    """Sharded reads at kube's rv were answered by the proxy itself: no pass-through counted."""

    def passed_through() -> Any:
        return ref.proxy.get("/debug/cache")["passed_through"]

    before = passed_through()
    for path in (CONFIGMAPS, WIDGETS):
        rv = ref.direct.get(path, limit=1)["metadata"]["resourceVersion"]
        pages = _pages(ref.proxy, path, 3, shards(2)[0], rv)
        assert len(pages) > 1 and all("shardInfo" in p["metadata"] for p in pages) == (path == CONFIGMAPS)
    assert passed_through() == before


@pytest.mark.parametrize("other", [{"labelSelector": "a b"}, {"fieldSelector": "foo=bar"}])
def test_a_bad_label_or_field_selector_is_reported_before_the_shard_selector(ref: Ref, other: dict[str, str]) -> None:
    path = with_query(CONFIGMAPS, shardSelector="x", **other)
    direct = _error(ref.direct, path)
    assert direct[0] == 400
    assert _error(ref.proxy, path) == direct

"""Table requests through ApiHandler: which printer, what passes through and why, includeObject, watches."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode

import orjson

from tests.support.factories import FakeResponse, pod
from tests.support.handlers import FakeUpstream, arun, until
from watchcache import apierrors
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.object import encode_object
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.http.request import Request
from watchcache.resources import PODS, ResourceRegistry, ResourceType
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext, ServeConfig
from watchcache.server.tables import CRDS
from watchcache.watchers.flush import FlushScheduler

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True)
WIDGETS = ResourceType("example.com", "v1", "widgets", "Widget", True)
CRD_TYPE = ResourceType(*CRDS, "CustomResourceDefinition", False)


def crd(columns: list[dict[str, Any]], rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "widgets.example.com", "resourceVersion": str(rv)},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "additionalPrinterColumns": columns}]},
    }  # fmt: skip


def widget(name: str, rv: int, replicas: int) -> Any:
    return encode_object(WIDGETS, {"metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv),
                                                "creationTimestamp": "2026-01-01T00:00:00Z"},
                                   "spec": {"replicas": replicas}})  # fmt: skip


class Stack:
    def __init__(self, *, kube: bool, crds: bool = True) -> None:
        self.upstream = FakeUpstream()
        self.upstream.rv = 10
        self.cachers: dict[ResourceType, Cacher] = {}
        for resource, objects in ((PODS, [pod(f"p{i}", rv=i + 1) for i in range(3)]),
                                  (LEASES, []), (WIDGETS, [widget("w", 4, 2)])):  # fmt: skip
            self.cachers[resource] = Cacher(resource, CacheConfig())
            self.cachers[resource].replace(objects, 10)
        types = [PODS, LEASES, WIDGETS]
        if crds:
            types.append(CRD_TYPE)
            self.cachers[CRD_TYPE] = Cacher(CRD_TYPE, CacheConfig())
            columns = [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}]
            self.cachers[CRD_TYPE].replace([encode_object(CRD_TYPE, crd(columns, 5))], 10)
        ctx = ApiContext(
            registry=ResourceRegistry(tuple(types)),
            cachers=self.cachers,
            upstream=self.upstream,
            codec=ContinueCodec(b"t" * 32),
            flusher=FlushScheduler(__import__("asyncio").get_running_loop()),
            config=ServeConfig(fresh_wait=0.2),
        )
        self.handler = ApiHandler(ctx, forward_tables=kube)

    def request(self, path: str, accept: str = TABLE, **query: Any) -> tuple[Request, FakeResponse]:
        qs = urlencode(query)
        req = Request("GET", (path + ("?" + qs if qs else "")).encode(), path, parse_qs(qs, keep_blank_values=True),
                      {"accept": accept}, b"", "1.1", "test")  # fmt: skip
        return req, FakeResponse()

    async def get(self, path: str, accept: str = TABLE, **query: Any) -> FakeResponse:
        req, resp = self.request(path, accept, **query)
        try:
            await self.handler(req, resp)
        except apierrors.StatusError as e:
            resp.send(e.code, e.body())
        return resp


def body(resp: FakeResponse) -> Any:
    return orjson.loads(resp.body)


@arun
async def test_a_list_is_a_table_with_the_rows_object_as_asked() -> None:
    s = Stack(kube=False)
    table = body(await s.get("/api/v1/namespaces/default/pods"))
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert [r["cells"][0] for r in table["rows"]] == ["p0", "p1", "p2"]
    assert {r["object"]["kind"] for r in table["rows"]} == {"PartialObjectMetadata"}
    none = body(await s.get("/api/v1/namespaces/default/pods", includeObject="None"))
    assert [r["object"] for r in none["rows"]] == [None] * 3
    full = body(await s.get("/api/v1/namespaces/default/pods", includeObject="Object"))
    assert [r["object"]["kind"] for r in full["rows"]] == ["Pod"] * 3
    page = body(await s.get("/api/v1/namespaces/default/pods", limit=2, includeObject="None"))
    assert len(page["rows"]) == 2 and page["metadata"]["continue"] and page["metadata"]["remainingItemCount"] == 1


@arun
async def test_identical_table_lists_at_one_snapshot_each_print_ages_from_their_own_clock() -> None:
    """Identical LISTs at one snapshot share a built body (a relist storm), but a Table's ages are the request's."""
    s = Stack(kube=False)
    now = [1_800_000_000 * 10**9]
    s.handler.tables.clock = lambda: now[0]
    aged = encode_object(PODS, {"metadata": {"name": "aged", "namespace": "default", "resourceVersion": "11",
                                             "creationTimestamp": "2027-01-15T08:00:00Z"}})  # fmt: skip
    s.cachers[PODS].apply([("ADDED", aged)])
    s.upstream.rv = 11
    ages = []
    for _ in range(2):
        table = body(await s.get("/api/v1/namespaces/default/pods", includeObject="None"))
        ages.append([row["cells"][4] for row in table["rows"] if row["cells"][0] == "aged"])
        now[0] += 3 * 3600 * 10**9
    assert ages[0] != ages[1], ages


@arun
async def test_a_bad_include_object_is_kubes_400_after_the_read() -> None:
    s = Stack(kube=False)
    message = (
        "Unable to convert to Table as requested: includeObject: Invalid value: \"all\": must be 'Metadata', "
        "'Object', 'None', or empty"
    )
    listed = await s.get("/api/v1/namespaces/default/pods", includeObject="all")
    assert (listed.status, body(listed)["message"]) == (400, message)
    # kube reads first: a missing object is still 404
    assert (await s.get("/api/v1/namespaces/default/pods/nope", includeObject="all")).status == 404
    assert (await s.get("/api/v1/namespaces/default/pods/p1", includeObject="all")).status == 400
    # A watch reads it once the watch is made: its selectors' and options' errors first (kit, v1.36).
    watched = await s.get("/api/v1/namespaces/default/pods", watch="true", includeObject="all")
    assert (watched.status, body(watched)["message"]) == (400, message)
    invalid = await s.get("/api/v1/namespaces/default/pods", watch="true", includeObject="all",
                          resourceVersionMatch="Exact")  # fmt: skip
    assert invalid.status == 422, body(invalid)
    bad = await s.get("/api/v1/namespaces/default/pods", watch="true", includeObject="all", labelSelector="a===")
    assert body(bad)["message"].startswith("unable to parse requirement"), body(bad)


@arun
async def test_a_table_watch_has_the_columns_in_its_first_event_only() -> None:
    import asyncio

    s = Stack(kube=False)
    req, resp = s.request("/api/v1/namespaces/default/pods", watch="true", resourceVersion="10")
    task = asyncio.ensure_future(s.handler(req, resp))
    pods = s.cachers[PODS]
    await until(lambda: len(pods.dispatcher) == 1)
    pods.apply([("ADDED", pod("p9", rv=11))])
    pods.apply([("MODIFIED", pod("p9", rv=12, labels={"a": "b"}))])
    await until(lambda: len(b"".join(resp.chunks).splitlines()) == 2)
    resp.disconnect()
    await asyncio.wait_for(task, 2)
    frames = [orjson.loads(line) for line in b"".join(resp.chunks).splitlines()]
    assert [f["type"] for f in frames] == ["ADDED", "MODIFIED"]
    assert frames[0]["object"]["columnDefinitions"] and frames[1]["object"]["columnDefinitions"] is None
    assert [len(f["object"]["rows"]) for f in frames] == [1, 1]
    assert [f["object"]["metadata"]["resourceVersion"] for f in frames] == ["11", "12"]


@arun
async def test_a_table_watchs_initial_events_are_one_row_tables() -> None:
    import asyncio

    s = Stack(kube=False)
    req, resp = s.request("/api/v1/namespaces/default/pods", watch="true", includeObject="Object")
    task = asyncio.ensure_future(s.handler(req, resp))
    await until(lambda: len(b"".join(resp.chunks).splitlines()) == 3)
    resp.disconnect()
    await asyncio.wait_for(task, 2)
    frames = [orjson.loads(line) for line in b"".join(resp.chunks).splitlines()]
    assert [f["type"] for f in frames] == ["ADDED"] * 3
    assert {f["object"]["kind"] for f in frames} == {"Table"}
    assert frames[0]["object"]["columnDefinitions"] and frames[2]["object"]["columnDefinitions"] is None
    assert [[r["cells"][0] for r in f["object"]["rows"]] for f in frames] == [["p0"], ["p1"], ["p2"]]
    assert {f["object"]["rows"][0]["object"]["kind"] for f in frames} == {"Pod"}


@arun
async def test_in_front_of_kube_what_cannot_be_printed_here_passes_through_counted() -> None:
    s = Stack(kube=True, crds=False)
    # a built-in kind whose printer the proxy does not have: kube prints it
    await s.get("/apis/coordination.k8s.io/v1/namespaces/default/leases")
    # a custom resource whose CRD is not cached here
    await s.get("/apis/example.com/v1/namespaces/default/widgets")
    assert s.handler.passed_through == {"table": 1, "table-crd": 1}
    assert len(s.upstream.forwarded) == 2
    # an object kube's printer would fail on (a time kube could not have decoded)
    bad = encode_object(PODS, {"metadata": {"name": "x", "namespace": "default", "resourceVersion": "11",
                                            "creationTimestamp": "yesterday"}})  # fmt: skip
    s.cachers[PODS].apply([("ADDED", bad)])
    s.upstream.rv = 11
    await s.get("/api/v1/namespaces/default/pods", resourceVersion="0")
    assert s.handler.passed_through == {"table": 2, "table-crd": 1}


@arun
async def test_a_custom_resource_is_printed_with_its_crds_columns_as_they_change() -> None:
    s = Stack(kube=True)
    table = body(await s.get("/apis/example.com/v1/namespaces/default/widgets"))
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Replicas"]
    assert table["rows"][0]["cells"] == ["w", 2]
    columns = [{"name": "Twice", "type": "string", "jsonPath": ".spec.replicas", "priority": 1},
               {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]  # fmt: skip
    s.cachers[CRD_TYPE].apply([("MODIFIED", encode_object(CRD_TYPE, crd(columns, 11)))])
    table = body(await s.get("/apis/example.com/v1/namespaces/default/widgets", resourceVersion="0"))
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [("Name", 0), ("Twice", 1), ("Age", 0)]
    assert table["rows"][0]["cells"][:2] == ["w", "2"]
    assert s.handler.passed_through == {}

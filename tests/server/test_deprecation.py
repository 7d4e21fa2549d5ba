"""kube's deprecation Warning on cached reads of v1 Endpoints: on what the resource handler answers, errors included."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlencode

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
from watchcache.watchers.flush import FlushScheduler

ENDPOINTS = ResourceType("", "v1", "endpoints", "Endpoints", True)
# As the reference apiserver (v1.36) sends it: curl -D - $KUBE_REFERENCE_URL/api/v1/endpoints
WARNING = ("Warning", '299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"')
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def endpoints(name: str, rv: int) -> Any:
    return encode_object(ENDPOINTS, {"metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv),
                                                  "creationTimestamp": "2026-01-01T00:00:00Z"}})  # fmt: skip


def handler(*, kube: bool) -> tuple[ApiHandler, dict[ResourceType, Cacher]]:
    cachers = {ENDPOINTS: Cacher(ENDPOINTS, CacheConfig()), PODS: Cacher(PODS, CacheConfig())}
    cachers[ENDPOINTS].replace([endpoints("e1", 2)], 10)
    cachers[PODS].replace([pod("p1", rv=3)], 10)
    upstream = FakeUpstream()
    upstream.rv = 10
    ctx = ApiContext(
        registry=ResourceRegistry((ENDPOINTS, PODS)),
        cachers=cachers,
        upstream=upstream,
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(asyncio.get_running_loop()),
        config=ServeConfig(fresh_wait=0.2),
    )
    return ApiHandler(ctx, forward_tables=kube), cachers


def request(path: str, accept: str = "application/json", **query: Any) -> Request:
    qs = urlencode(query)
    return Request("GET", (path + ("?" + qs if qs else "")).encode(), path, parse_qs(qs, keep_blank_values=True),
                   {"accept": accept}, b"", "1.1", "test")  # fmt: skip


async def answer(h: ApiHandler, path: str, accept: str = "application/json", **query: Any) -> FakeResponse:
    resp = FakeResponse()
    try:
        await h(request(path, accept, **query), resp)
    except apierrors.StatusError as e:  # as the HTTP layer writes it: no Warning
        resp.send(e.code, e.body())
    return resp


@arun
async def test_cached_reads_of_v1_endpoints_carry_kubes_warning_errors_included() -> None:
    h, _ = handler(kube=True)
    answers = {
        "list": await answer(h, "/api/v1/endpoints", resourceVersion="0"),
        "get": await answer(h, "/api/v1/namespaces/default/endpoints/e1", resourceVersion="0"),
        "table": await answer(h, "/api/v1/namespaces/default/endpoints", TABLE, resourceVersion="0"),
        "404": await answer(h, "/api/v1/namespaces/default/endpoints/nope", resourceVersion="0"),
        "400": await answer(h, "/api/v1/endpoints", labelSelector="a b c"),
        "410": await answer(h, "/api/v1/endpoints", limit="1", resourceVersion="1", resourceVersionMatch="Exact"),
    }
    assert {k: r.status for k, r in answers.items()} == {
        "list": 200, "get": 200, "table": 200, "404": 404, "400": 400, "410": 410,
    }  # fmt: skip
    assert {k: r.headers for k, r in answers.items()} == {k: [WARNING] for k in answers}
    pods = await answer(h, "/api/v1/pods", resourceVersion="0")
    assert (pods.status, pods.headers) == (200, [])
    # Before the resource's handler, as kube: negotiation's 406 has none.
    refused = await answer(h, "/api/v1/endpoints", "text/html")
    assert (refused.status, refused.headers) == (406, [])


@arun
async def test_a_watch_of_v1_endpoints_carries_the_warning() -> None:
    h, cachers = handler(kube=True)
    resp = FakeResponse()
    task = asyncio.ensure_future(h(request("/api/v1/namespaces/default/endpoints", watch="true", resourceVersion="10"),
                                   resp))  # fmt: skip
    await until(lambda: len(cachers[ENDPOINTS].dispatcher) == 1)
    resp.disconnect()
    await asyncio.wait_for(task, 2)
    assert (resp.status, resp.headers) == (200, [WARNING])


@arun
async def test_the_simulated_cluster_a_v1_32_sends_none() -> None:
    h, _ = handler(kube=False)
    resp = await answer(h, "/api/v1/endpoints", resourceVersion="0")
    assert (resp.status, resp.headers) == (200, [])


# ---------------------------------------------------------------------- custom resources (session 48)

CRDS = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


def widgets(version: str) -> ResourceType:
    return ResourceType("example.com", version, "widgets", "Widget", True)


def crd(*versions: dict[str, Any]) -> Any:
    spec = {"group": "example.com", "names": {"plural": "widgets", "kind": "Widget"}, "versions": list(versions)}
    return encode_object(CRDS, {"metadata": {"name": "widgets.example.com", "resourceVersion": "5"}, "spec": spec})


def test_a_deprecated_crd_versions_warning_is_kubes_default_or_its_own() -> None:
    # apiextensions-apiserver's defaultDeprecationWarning: "; use" the highest served, not deprecated
    # version above it (kube-aware order: GA > beta > alpha, then major, then minor).
    from watchcache.server.deprecation import crd_warnings, warning_value

    versions = [
        {"name": "v1alpha1", "served": True, "deprecated": True},
        {"name": "v1beta1", "served": True, "deprecated": True, "deprecationWarning": 'say "no"'},
        {"name": "v1beta2", "served": True},
        {"name": "v1", "served": True},
        {"name": "v2", "served": False},
        {"name": "v3alpha1", "served": True, "deprecated": True},
    ]
    got = crd_warnings({"spec": {"group": "example.com", "names": {"kind": "Widget"}, "versions": versions}})
    assert got == {
        "v1alpha1": (
            ("Warning", warning_value("example.com/v1alpha1 Widget is deprecated; use example.com/v1 Widget")),
        ),
        "v1beta1": (("Warning", '299 - "say \\"no\\""'),),
        "v3alpha1": (
            ("Warning", warning_value("example.com/v3alpha1 Widget is deprecated; use example.com/v1 Widget")),
        ),
    }
    only = crd_warnings(
        {"spec": {"group": "g", "names": {"kind": "K"}, "versions": [{"name": "v1", "deprecated": True}]}}
    )
    assert only == {"v1": (("Warning", warning_value("g/v1 K is deprecated")),)}


def test_kube_aware_version_order() -> None:
    from functools import cmp_to_key

    from watchcache.server.deprecation import compare_kube_aware

    ordered = ["v2", "v1", "v11beta2", "v10beta3", "v3beta1", "v12alpha1", "v11alpha2", "foo1", "foo10"]
    assert sorted(ordered[::-1], key=cmp_to_key(compare_kube_aware), reverse=True) == ordered


@arun
async def test_cached_reads_of_a_deprecated_crd_version_carry_its_warning() -> None:
    # The kit (session 48, a CRD with a deprecated v1beta1): kube warns on every request of it; the
    # proxy's cached LISTs, watches and GETs at resourceVersion=0 sent none.
    beta, ga = widgets("v1beta1"), widgets("v1")
    cachers = {CRDS: Cacher(CRDS, CacheConfig()), beta: Cacher(beta, CacheConfig()), ga: Cacher(ga, CacheConfig())}
    cachers[CRDS].replace(
        [crd({"name": "v1beta1", "served": True, "deprecated": True}, {"name": "v1", "served": True})], 10
    )
    for t in (beta, ga):
        cachers[t].replace(
            [encode_object(t, {"metadata": {"name": "w", "namespace": "default", "resourceVersion": "3"}})], 10
        )
    upstream = FakeUpstream()
    upstream.rv = 10
    ctx = ApiContext(
        registry=ResourceRegistry((CRDS, beta, ga)),
        cachers=cachers,
        upstream=upstream,
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(asyncio.get_running_loop()),
        config=ServeConfig(fresh_wait=0.2),
    )
    h = ApiHandler(ctx, forward_tables=True)
    want = [("Warning", '299 - "example.com/v1beta1 Widget is deprecated; use example.com/v1 Widget"')]
    base = "/apis/example.com/{}/namespaces/default/widgets"
    assert (await answer(h, base.format("v1beta1"), resourceVersion="0")).headers == want
    assert (await answer(h, base.format("v1beta1") + "/w", resourceVersion="0")).headers == want
    assert (await answer(h, base.format("v1"), resourceVersion="0")).headers == []
    # The CRD changes: no longer deprecated, no warning.
    cachers[CRDS].replace([crd({"name": "v1beta1", "served": True}, {"name": "v1", "served": True})], 11)
    assert (await answer(h, base.format("v1beta1"), resourceVersion="0")).headers == []

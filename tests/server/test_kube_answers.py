"""Answers a client can tell apart from kube-apiserver's, found by the reference tier's differential tests.

Each test states what kube-apiserver v1.36 answered (``tests/reference/test_differential.py``
compares against it live when the kit is there); these run without the kit, on the handler.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.handlers import Harness, arun
from watchcache.http.request import Request, split_target
from watchcache.server.app import ApiHandler
from watchcache.server.options import parse_bool, parse_list_options


@arun
async def test_a_list_at_resource_version_0_ignores_limit():
    # kube's cacher (computeListLimit): "the limit is ignored for requests that set RV == 0". client-go
    # relies on it: a paged answer to its rv=0 LIST makes the reflector believe the watch cache is off
    # (paginatedResult) and page its later relists at an exact rv.
    h = Harness()
    for query in ({"resourceVersion": "0", "limit": "2"}, {"resourceVersion": "0", "limit": "2",
                                                           "resourceVersionMatch": "NotOlderThan"}):  # fmt: skip
        resp = await h.list(**query)
        assert resp.status == 200
        doc = resp.json()
        assert [i["metadata"]["name"] for i in doc["items"]] == [f"p{i}" for i in range(5)]
        assert doc["metadata"] == {"resourceVersion": "10"}  # no continue, no remainingItemCount
    # any other resourceVersion still pages
    assert len((await h.list(limit="2")).json()["items"]) == 2
    assert len((await h.list(limit="2", resourceVersion="10")).json()["items"]) == 2


@pytest.mark.parametrize("rv", ["0", ""], ids=["rv0", "unset"])
@arun
async def test_a_watch_from_0_or_unset_with_bookmarks_ends_its_initial_events_with_a_bookmark(rv: str):
    # kube >= 1.34 defaults such a watch to sendInitialEvents=true&resourceVersionMatch=NotOlderThan
    # (SetListOptionsDefaults): the initial ADDED events are followed by the initial-events-end bookmark.
    h = Harness()
    query = {"allowWatchBookmarks": "true", **({"resourceVersion": rv} if rv else {})}
    events = (await h.watch(**query)).events()
    assert [e["type"] for e in events] == ["ADDED"] * 5 + ["BOOKMARK"]
    assert events[-1]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "10", "annotations": {"k8s.io/initial-events-end": "true"}},
        "spec": {"containers": None},  # a Pod's zero values, as kube's bookmark (cache/zeros.py)
        "status": {},
    }


@arun
async def test_other_watches_get_no_initial_events_end_bookmark():
    h = Harness()
    assert [e["type"] for e in (await h.watch(resourceVersion="0")).events()] == ["ADDED"] * 5  # no bookmarks
    assert (await h.watch(resourceVersion="10", allowWatchBookmarks="true")).events() == []  # from an rv


@arun
async def test_invalid_list_options_name_no_object():
    # kube: "details":{"group":"meta.k8s.io","kind":"ListOptions","causes":[...]} -- no empty "name"
    resp = await (Harness()).list(resourceVersionMatch="NotOlderThan")
    assert resp.status == 422
    assert resp.json()["details"] == {
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": [
            {
                "reason": "FieldValueForbidden",
                "message": "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                "field": "resourceVersionMatch",
            }
        ],
    }


@pytest.mark.parametrize("name", ["limit", "timeoutSeconds"])
@arun
async def test_an_unparsable_integer_is_kubes_400(name: str):
    resp = await (Harness()).list(**{name: "abc"})
    assert resp.status == 400
    assert resp.json()["message"] == 'strconv.ParseInt: parsing "abc": invalid syntax'


@arun
async def test_a_negative_timeout_is_ignored_by_a_list():
    resp = await (Harness()).list(timeoutSeconds="-1")
    assert resp.status == 200 and len(resp.json()["items"]) == 5


@arun
async def test_a_watch_with_a_negative_timeout_ends_at_once_as_kubes():
    # kube: 200, then an ERROR event: 500 InternalError "context deadline exceeded"
    h = Harness()
    resp = await h.start_watch(timeoutSeconds="-1").ended(2.0)
    assert resp.status == 200
    [event] = resp.events()
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"], event["object"]["message"]) == (
        500,
        "InternalError",
        "context deadline exceeded",
    )


@arun
async def test_a_too_old_exact_list_is_kubes_410():
    # kube: "The resourceVersion for the provided list is too old." (a watch: "too old resource version: N (M)")
    h = Harness(max_events=2)
    for i in range(4):
        h.write("MODIFIED", "p0", labels={"n": str(i)})
    resp = await h.list(resourceVersion="10", resourceVersionMatch="Exact")
    assert resp.status == 410
    assert resp.json()["message"] == "The resourceVersion for the provided list is too old."


@arun
async def test_a_too_old_exact_list_passes_through_to_an_upstream_that_may_still_have_it():
    # kube-apiserver reads an Exact LIST older than its watch cache from etcd (200 until etcd
    # compacts it): in front of it the proxy cannot know, so the upstream answers.
    h = Harness(max_events=2)
    h.upstream.answers_old_reads = True
    for i in range(4):
        h.write("MODIFIED", "p0", labels={"n": str(i)})
    await h.list(resourceVersion="10", resourceVersionMatch="Exact")
    assert h.upstream.forwarded == ["/api/v1/namespaces/default/pods"]
    # Inside the window the cache answers itself.
    resp = await h.list(resourceVersion=str(h.cacher.rv), resourceVersionMatch="Exact")
    assert resp.status == 200 and h.upstream.forwarded == ["/api/v1/namespaces/default/pods"]


@arun
async def test_a_too_new_resource_version_is_kubes_504_timeout():
    # kube: NewTimeoutError: "Timeout: Too large resource version: N, current: M"
    resp = await (Harness(fresh_wait=0.05)).list(resourceVersion="99", resourceVersionMatch="NotOlderThan")
    assert resp.status == 504
    assert resp.json()["message"] == "Timeout: Too large resource version: 99, current: 10"


@arun
async def test_a_custom_resources_field_selector_beyond_name_and_namespace_goes_upstream():
    # Perhaps one of the CRD's selectableFields (GA in 1.32): the upstream knows, the cache does not.
    from watchcache.dispatch.cacher import Cacher
    from watchcache.resources import ResourceType

    widgets = ResourceType("example.com", "v1", "widgets", "Widget", True, "widget")
    h = Harness()
    cacher = Cacher(widgets)
    cacher.replace([], 10)
    h.ctx.cachers[widgets] = cacher
    h.ctx.registry.add(widgets)
    path = "/apis/example.com/v1/namespaces/default/widgets"
    assert (await h.request(path, {"fieldSelector": "metadata.name=a"})).status == 200  # from the cache
    await h.request(path, {"fieldSelector": "spec.color=red"})
    assert h.upstream.forwarded == [path]
    assert h.handler.passed_through == {"field-selector": 1}


@arun
async def test_several_invalid_list_options_are_listed_as_kube_aggregates_them():
    resp = await (Harness()).request(
        "/api/v1/namespaces/default/pods", {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "Exact"}
    )
    assert resp.status == 422
    assert resp.json()["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting '
        'resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: "Exact": supported values: '
        '"NotOlderThan"]'
    )


@arun
async def test_a_list_with_an_unparsable_resource_version_says_invalid_resource_version():
    resp = await (Harness()).list(resourceVersion="abc")
    assert (resp.status, resp.json()["message"]) == (
        400,
        'invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": '
        "invalid syntax",
    )


@arun
async def test_a_continue_token_is_read_before_the_resource_version_next_to_it():
    # kube: a garbage token is "invalid continue token" whatever the resourceVersion beside it;
    # a good one with a resourceVersion other than 0 is refused for the combination.
    h = Harness()
    resp = await h.list(**{"continue": "not-a-token", "resourceVersion": "5"})
    assert resp.status == 400 and resp.json()["message"].startswith("invalid continue token: ")
    token = (await h.list(limit="2")).json()["metadata"]["continue"]
    resp = await h.list(**{"continue": token, "resourceVersion": "5"})
    assert (resp.status, resp.json()["message"]) == (
        400,
        "specifying resource version is not allowed when using continue",
    )


# ---------------------------------------------------------------------- found by a differential fuzz (session 45)


@pytest.mark.parametrize("watch", ["1", "true", ""], ids=["1", "true", "empty"])
@arun
async def test_a_get_of_one_object_with_a_watch_parameter_is_a_get(watch: str):
    # kube's RequestInfoFactory turns a GET into a watch only when it names no object; the GET
    # handler ignores ?watch. The proxy served such a GET as a watch (and without a timeout, hung).
    resp = await asyncio.wait_for((Harness()).get("p1", watch=watch), 5)
    assert resp.status == 200
    assert (resp.json()["kind"], resp.json()["metadata"]["name"]) == ("Pod", "p1")


@pytest.mark.parametrize(("value", "watch"), [("", True), ("garbage", True), ("0", False), ("FALSE", False)])
def test_a_boolean_parameter_is_false_only_when_absent_0_or_false(value: str, watch: bool):
    # apimachinery's Convert_Slice_string_To_bool: "Any other value (including empty string) resolves to true."
    assert parse_bool(value) is watch
    assert parse_list_options({"watch": [value], "allowWatchBookmarks": [value]}).watch is watch
    assert parse_bool(None) is False


@arun
async def test_an_empty_watch_parameter_starts_a_watch():
    # ?watch= is a watch at kube (with initial events, as from an unset rv).
    events = (await (Harness()).watch(watch="", resourceVersion="0")).events()
    assert [e["type"] for e in events] == ["ADDED"] * 5


@pytest.mark.parametrize(
    ("value", "why"),
    [(" 2", "invalid syntax"), ("1_0", "invalid syntax"), ("2 ", "invalid syntax"),
     ("9223372036854775808", "value out of range"), ("9" * 5000, "value out of range")],
)  # fmt: skip
@arun
async def test_an_integer_parameter_is_parsed_as_go_parses_it(value: str, why: str):
    # strconv.ParseInt(s, 10, 64): no spaces or underscores (Python's int() takes both).
    resp = await (Harness()).list(limit=value)
    assert (resp.status, resp.json()["message"]) == (400, f'strconv.ParseInt: parsing "{value}": {why}')
    assert (await (Harness()).list(limit="+2")).status == 200


@arun
async def test_a_resource_version_is_parsed_as_go_parses_it():
    # ParseUint: leading zeros are fine at any length; past 2^64-1 the words are "value out of range".
    h = Harness()
    assert (await h.list(resourceVersion="0" * 30 + "10")).status == 200
    for rv in ("99999999999999999999999", "1" + "0" * 5000):
        resp = await h.list(resourceVersion=rv)
        assert (resp.status, resp.json()["message"]) == (
            400,
            f'invalid resource version: resourceVersion: Invalid value: "{rv}": strconv.ParseUint: parsing "{rv}": '
            "value out of range",
        )


@arun
async def test_a_watch_with_a_negative_timeout_and_a_resource_version_ends_at_once_with_no_event():
    # kube: no freshness wait to fail, so no ERROR event (without a resourceVersion: the test above).
    for rv in ("10", "0", "1"):
        resp = await (Harness()).start_watch(timeoutSeconds="-1", resourceVersion=rv).ended(2.0)
        assert (resp.status, resp.events()) == (200, [])


@arun
async def test_an_empty_partial_object_metadata_list_has_null_items():
    # kube: "items":null (a nil slice of PartialObjectMetadata); a typed list's empty items are [].
    h = Harness()
    accept = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
    req = h.make_request("/api/v1/namespaces/default/pods", {"labelSelector": "nope=1"})
    req.headers["accept"] = accept
    resp = await h.send(req)
    assert resp.status == 200 and resp.json()["items"] is None
    assert (await h.list(labelSelector="nope=1")).json()["items"] == []


@arun
async def test_a_pods_status_pod_ips_field_label_is_accepted_and_empty():
    # kube's conversion accepts status.podIPs; its field set for a pod never holds it: "" for all.
    h = Harness()
    assert (await h.list(fieldSelector="status.podIPs=10.0.0.1")).json()["items"] == []
    assert len((await h.list(fieldSelector="status.podIPs=")).json()["items"]) == 5


@arun
async def test_a_get_ignores_list_options():
    # kube decodes a GET's GetOptions only: limit, timeoutSeconds, resourceVersionMatch beside it are ignored.
    h = Harness()
    for query in ({"limit": "1.5"}, {"resourceVersionMatch": "bogus"}, {"timeoutSeconds": "x", "limit": " 2"}):
        resp = await h.get("p1", resourceVersion="0", **query)
        assert (resp.status, resp.json()["metadata"]["name"]) == (200, "p1"), query


def test_services_select_on_cluster_ip_and_type_and_replica_sets_on_metadata_only():
    # kube >= 1.31 (kubelet's and kube-proxy's informers send spec.clusterIP!=None); apps/v1 has no
    # conversion for a ReplicaSet's status.replicas.
    from watchcache.resources import REPLICASETS, SERVICES

    assert SERVICES.selectable_fields == {"metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"}
    headless = {"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "type": "ClusterIP"}}
    assert SERVICES.extract_fields(headless)["spec.clusterIP"] == "None"
    assert REPLICASETS.selectable_fields == {"metadata.name", "metadata.namespace"}


def test_kinds_whose_conversion_leaves_out_metadata_namespace_refuse_it():
    # pkg/apis/core/v1/conversion.go: a Node's and a Namespace's field labels are their own, without
    # metadata.namespace (kit: 400 "field label not supported: metadata.namespace"); other
    # cluster-scoped kinds (FlowSchemas) take runtime's default, which has it; a kind learned from
    # discovery that leaves it out (CertificateSigningRequests) is the upstream's to refuse.
    from watchcache.cache.predicate import SelectionPredicate, UnsupportedField
    from watchcache.resources import FLOWSCHEMAS, NAMESPACES, NODES
    from watchcache.upstream.discovery import resource_type_from

    for resource in (NODES, NAMESPACES):
        assert "metadata.namespace" not in resource.selectable_fields
        with pytest.raises(UnsupportedField) as e:
            SelectionPredicate.parse(resource, None, "", "metadata.namespace=x")
        assert (str(e.value), e.value.custom) == ("field label not supported: metadata.namespace", False)
    assert "metadata.namespace" in FLOWSCHEMAS.selectable_fields
    SelectionPredicate.parse(FLOWSCHEMAS, None, "", "metadata.namespace=")
    csrs = resource_type_from(
        "certificates.k8s.io", "v1", {"name": "certificatesigningrequests", "kind": "CertificateSigningRequest"}
    )
    with pytest.raises(UnsupportedField) as e:
        SelectionPredicate.parse(csrs, None, "", "metadata.namespace=x")
    assert e.value.custom  # passed through


@arun
async def test_a_watch_from_an_rv_ahead_of_the_cache_waits_for_it_instead_of_a_504():
    # kube's cacher (v1.36) accepts a watch from an rv it has not reached and sends the events after
    # it; only a watch-list (sendInitialEvents=true) fails with 504 (tests/server/test_watch.py).
    h = Harness(fresh_wait=0.05)
    stream = h.start_watch(resourceVersion="12", timeoutSeconds="30")
    await asyncio.sleep(0.2)  # past --fresh-wait: still waiting, no frame, no ERROR
    assert not stream.task.done() and stream.resp.events() == []
    h.write("MODIFIED", "p1", labels={"i": "a"})  # 11: not after 12
    h.write("MODIFIED", "p2", labels={"i": "b"})  # 12: the rv it waits for, not after it either
    await stream.started()
    h.write("MODIFIED", "p3", labels={"i": "c"})  # 13: the first event after 12
    resp = await stream.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in resp.events()] == [("MODIFIED", "p3")]


@arun
async def test_a_watch_from_an_rv_that_never_comes_ends_at_its_timeout_with_no_event():
    h = Harness(fresh_wait=0.05)
    resp = await h.start_watch(resourceVersion="99", timeoutSeconds="1").ended(3.0)
    assert (resp.status, resp.events()) == (200, [])
    assert len(h.cacher._waiters) == 0  # nothing left waiting


@arun
async def test_a_watch_waiting_for_an_rv_ahead_ends_when_its_client_goes():
    h = Harness(fresh_wait=0.05)
    stream = h.start_watch(resourceVersion="99", timeoutSeconds="600")
    await asyncio.sleep(0.2)
    assert len(h.cacher._waiters) == 1 and not stream.task.done()
    stream.resp.disconnect()
    await stream.ended(1.0)
    await asyncio.sleep(0)
    assert len(h.cacher._waiters) == 0 and h.handler.inflight == 0


def _unprovable() -> Harness:
    """In front of kube (it answers reads at any rv at once), of a resource whose probes get no bookmark."""
    h = Harness(fresh_wait=2.0)
    h.upstream.answers_reads_ahead = True
    h.upstream.no_bookmarks = True
    return h


@arun
async def test_a_read_ahead_of_a_cache_the_upstream_cannot_prove_goes_to_the_upstream_at_once():
    # kube serves events from etcd: their probes get no bookmark, and kube answers a read at any rv
    # at once (200, or its own 504). A GET or LIST goes there without a wait; a watch waits for events.
    h = _unprovable()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await h.list(resourceVersion="50")
    await h.get("p1", resourceVersion="50")
    await h.list(resourceVersion="50", resourceVersionMatch="Exact")
    assert loop.time() - started < 0.5
    assert h.upstream.forwarded == ["/api/v1/namespaces/default/pods", "/api/v1/namespaces/default/pods/p1",
                                    "/api/v1/namespaces/default/pods"]  # fmt: skip
    assert h.handler.passed_through == {"unreached-rv": 3}
    stream = h.start_watch(resourceVersion="12", timeoutSeconds="30")
    h.write("MODIFIED", "p1", labels={"i": "a"})
    h.write("MODIFIED", "p2", labels={"i": "b"})
    await stream.started()
    h.write("MODIFIED", "p3", labels={"i": "c"})
    resp = await stream.close()
    assert [e["object"]["metadata"]["name"] for e in resp.events()] == ["p3"]
    # A resource the upstream proves: a read ahead still waits, then 504 (kube's answer).
    h.upstream.no_bookmarks = False
    assert (await h.list(resourceVersion="99")).status == 504


@arun
async def test_a_watch_from_an_rv_ahead_is_accepted_at_once_and_ends_at_its_timeout_from_the_request():
    # kube's cacher accepts such a watch at once (its headers go out before any wait) and its
    # timeoutSeconds bounds the whole watch. The session-48 fuzz against the kit: the proxy's first
    # byte came after --fresh-wait, and the watch ran --fresh-wait + timeoutSeconds.
    # The bounds are the semantics', not the machine's: accepted long before --fresh-wait (5 s) could
    # have passed, ended at its 1 s timeout, far from the 6 s it took before.
    h = Harness(fresh_wait=5.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    stream = h.start_watch(resourceVersion="99", timeoutSeconds="1")
    while not stream.resp.started and not stream.task.done():
        await asyncio.sleep(0.01)
    accepted = loop.time() - began
    assert stream.resp.status == 200 and accepted < 2.5, accepted
    resp = await stream.ended(6.0)
    assert (resp.status, resp.events()) == (200, [])
    assert 0.9 < loop.time() - began < 3.0, loop.time() - began
    assert len(h.cacher._waiters) == 0


@arun
async def test_a_watch_list_ahead_of_a_cache_the_upstream_cannot_prove_goes_to_the_upstream():
    # kube serves events from etcd: a watch-list at an rv of a write elsewhere gets their state at
    # once there; the proxy's cache of them cannot be proven to reach it (no bookmark), so the
    # watch-list is the upstream's, as a LIST there is (the fuzz: 504 after --fresh-wait).
    h = _unprovable()
    query = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "5"}
    resp = await h.start_watch(resourceVersion="50", **query).ended(3.0)
    assert h.upstream.forwarded == ["/api/v1/namespaces/default/pods"], resp.body
    assert h.handler.passed_through == {"unreached-rv": 1}
    # A resource the upstream proves: the watch-list waits, then kube's 504 as an ERROR event.
    h.upstream.no_bookmarks = False
    resp = await h.start_watch(resourceVersion="99", **{**query, "timeoutSeconds": "30"}).ended(4.0)
    assert [(e["type"], e["object"]["code"]) for e in resp.events()] == [("ERROR", 504)]


def test_a_legacy_watch_with_a_continue_token_is_refused_for_the_match_kube_defaults_it_to():
    # SetListOptionsDefaults gives a watch from "" or "0" sendInitialEvents=true and NotOlderThan
    # before validation (kit: 422, with this one cause).
    from watchcache.apierrors import StatusError
    from watchcache.cache.semantics import plan_watch

    for rv in ("", "0"):
        with pytest.raises(StatusError) as e:
            plan_watch(parse_list_options({"watch": ["1"], "continue": ["x"], "resourceVersion": [rv]}))
        assert e.value.code == 422
        assert json.loads(e.value.json())["details"]["causes"] == [
            {
                "reason": "FieldValueForbidden",
                "message": "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                "field": "resourceVersionMatch",
            }
        ]
    # From another rv there is no default, and a watch does not read the token.
    plan_watch(parse_list_options({"watch": ["1"], "continue": ["x"], "resourceVersion": ["5"]}))


@arun
async def test_an_exact_list_of_one_object_ahead_of_the_cache_goes_to_the_upstream_at_once():
    # kube reads a LIST narrowed to one name (in a namespace) as one key, from etcd at an exact rv
    # (ShouldDelegateExactRV: not recursive): a far-future one is etcd's 504 at once, where the proxy
    # waited --fresh-wait (the session-48 re-probe). NotOlderThan, or every namespace, waits as before.
    # (Passed through, not answered 504 after the wait: the pass-through count says which.)
    h = Harness(fresh_wait=1.0)
    h.upstream.answers_reads_ahead = True
    one = {"fieldSelector": "metadata.name=p1", "resourceVersion": "99"}
    await h.list(**one, resourceVersionMatch="Exact")
    await h.list(**one, limit="5")  # legacy: a paged LIST at an rv is Exact
    assert h.handler.passed_through == {"unreached-rv": 2}
    assert (await h.list(**one, resourceVersionMatch="NotOlderThan")).status == 504
    every = await h.request("/api/v1/pods", {**one, "resourceVersionMatch": "Exact"})
    assert every.status == 504 and h.handler.passed_through == {"unreached-rv": 2}


@arun
async def test_a_get_with_export_is_refused_as_by_kube():
    # GetResource refuses it before anything else: any first value but "0" or "false" (kit, v1.36).
    h = Harness()
    for value in ("1", "true", "x", ""):
        resp = await h.get("p1", resourceVersion="0", export=value)
        assert (resp.status, resp.json()["message"]) == (
            400,
            "the export parameter, deprecated since v1.14, is no longer supported",
        ), value
    assert (await h.get("nope", resourceVersion="abc", export="1")).status == 400
    for value in ("0", "false", "FALSE"):
        assert (await h.get("p1", resourceVersion="0", export=value)).status == 200, value
    assert (await h.list(resourceVersion="0", export="1")).status == 200  # a LIST does not read it


@arun
async def test_a_json_answer_ends_with_a_newline_as_kubes_encoder_writes_it():
    h = Harness()
    assert (await h.get("p1", resourceVersion="0")).body.endswith(b"}\n")
    assert (await h.list(resourceVersion="0")).body.endswith(b"]}\n")
    missing = await h.get("nope", resourceVersion="0")
    assert missing.status == 404 and missing.body.endswith(b"}\n")
    # a watch's ERROR event is one line: the Status inside it has no newline of its own
    resp = await h.start_watch(timeoutSeconds="-1").ended(2.0)
    assert b"".join(resp.chunks).count(b"\n") == 1


@arun
async def test_a_watch_waiting_for_an_rv_ahead_ends_at_shutdown_with_no_event():
    # Not a watcher yet, so no final bookmark: the shutdown ends its wait, and its stream, at once
    # (before, it held the shutdown's wait for in-flight requests until the caches stopped).
    h = Harness(fresh_wait=0.05)
    stream = h.start_watch(resourceVersion="99", timeoutSeconds="600")
    await asyncio.sleep(0.2)
    assert len(h.ctx.waiting_watches) == 1 and not stream.task.done()
    h.ctx.end_waiting_watches()
    resp = await stream.ended(1.0)
    assert (resp.status, resp.events(), resp.ended) == (200, [], True)
    assert len(h.ctx.waiting_watches) == 0 and len(h.cacher._waiters) == 0


# ---------------------------------------------------------------------- pretty answers and error order (session 46)


def _as(h: Harness, path: str, query: dict[str, str], headers: dict[str, str]):
    req = h.make_request(path, query)
    req.headers.update(headers)
    return h.send(req)


PODS_PATH = "/api/v1/namespaces/default/pods"


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ({"pretty": "true"}, {}),
        ({"pretty": "1"}, {}),
        ({}, {"user-agent": "curl/8.5.0"}),
        ({}, {"user-agent": "Wget/1.21"}),
        ({}, {"user-agent": "Mozilla/5.0 (X11; Linux x86_64)"}),
        ({"pretty": ""}, {"user-agent": "curl/8.5.0"}),  # an empty value leaves it to the User-Agent
        ({}, {"accept": "application/json;pretty=1"}),
    ],
    ids=["pretty-true", "pretty-1", "curl", "wget", "browser", "empty-curl", "accept-pretty"],
)
@arun
async def test_a_person_gets_indented_json_with_no_newline_at_its_end(query, headers):
    # kube: isPrettyPrint (or the media type's pretty=1) picks json.MarshalIndent(obj, "", "  "),
    # which writes no newline after the object.
    h = Harness()
    got = await _as(h, PODS_PATH + "/p1", {"resourceVersion": "0", **query}, headers)
    assert got.status == 200
    assert got.body.startswith(b'{\n  "kind": "Pod",\n  "apiVersion": "v1",\n  "metadata": {\n    "name": "p1",')
    assert got.body.endswith(b"\n}")
    listed = await _as(h, PODS_PATH, {"resourceVersion": "0", **query}, headers)
    assert listed.body.startswith(b'{\n  "kind": "PodList",\n  "apiVersion": "v1",\n  "metadata": {\n')
    assert listed.body.endswith(b"\n  ]\n}")
    assert listed.json() == (await h.list(resourceVersion="0")).json()  # the same content
    missing = await _as(h, PODS_PATH + "/nope", {"resourceVersion": "0", **query}, headers)
    assert missing.status == 404
    assert missing.body.startswith(b'{\n  "kind": "Status",\n') and missing.body.endswith(b"\n}")


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ({"pretty": "false"}, {"user-agent": "curl/8.5.0"}),  # the parameter decides over the User-Agent
        ({"pretty": "yes"}, {"user-agent": "curl/8.5.0"}),  # Go's ParseBool refuses it: false
        ({}, {"user-agent": "kubectl/v1.36.0 (linux/amd64)"}),
        ({}, {"user-agent": "Go-http-client/1.1"}),
        ({}, {"accept": "application/json;pretty=0"}),
    ],
    ids=["pretty-false", "pretty-yes", "kubectl", "go", "accept-pretty-0"],
)
@arun
async def test_other_clients_get_compact_json(query, headers):
    got = await _as(Harness(), PODS_PATH + "/p1", {"resourceVersion": "0", **query}, headers)
    assert got.body.startswith(b'{"kind":"Pod",') and got.body.endswith(b"}\n")


@arun
async def test_a_watch_is_never_indented():
    h = Harness()
    stream = await h.start_watch(resourceVersion="0", pretty="true", timeoutSeconds="1").ended(5.0)
    frames = b"".join(stream.chunks).splitlines()
    assert len(frames) == 5 and all(f.startswith(b'{"type":"ADDED","object":{"kind":"Pod",') for f in frames)


@arun
async def test_an_indented_answer_escapes_as_go_and_a_large_one_stays_compact(monkeypatch):
    from watchcache.server import pretty

    assert pretty.indent([b'{"a":"<b> & \xe2\x80\xa8","c":[],"d":{}}']) == (
        b'{\n  "a": "\\u003cb\\u003e \\u0026 \\u2028",\n  "c": [],\n  "d": {}\n}'
    )
    monkeypatch.setattr(pretty, "PRETTY_MAX", 100)
    got = await (Harness()).list(resourceVersion="0", pretty="true")
    assert got.status == 200 and got.body.startswith(b'{"kind":"PodList",') and got.body.endswith(b"]}\n")


@arun
async def test_a_compact_status_escapes_html_characters_as_go():
    got = await (Harness()).list(fieldSelector="a<b=c")
    assert got.status == 400 and b"a\\u003cb" in got.body and b"<" not in got.body


@arun
async def test_a_field_selector_term_empty_on_both_sides_is_dropped_before_fields_are_checked():
    # kube's fields.ParseSelector turns "==" into Everything before the resource's field labels are converted
    h = Harness()
    for selector in ("==", "=", "!=", "metadata.name=p1,=="):
        got = await h.list(fieldSelector=selector, resourceVersion="0")
        assert got.status == 200, (selector, got.body)
    assert [i["metadata"]["name"] for i in (await h.list(fieldSelector="metadata.name=p1,==")).json()["items"]] == [
        "p1"
    ]


@pytest.mark.parametrize(
    ("query", "code", "starts"),
    [
        # integers first (timeoutSeconds before limit, the order of ListOptions' fields)
        ({"limit": "x", "timeoutSeconds": "y", "labelSelector": "a b"}, 400, 'strconv.ParseInt: parsing "y"'),
        # then the label selector's syntax, before the field selector's
        ({"labelSelector": "a b", "fieldSelector": "x"}, 400, "unable to parse requirement"),
        # then the field selector's syntax, before the options' 422
        ({"fieldSelector": "x", "resourceVersionMatch": "Exact"}, 400, "invalid selector: 'x'"),
        # then the 422, before an unknown field label
        (
            {"fieldSelector": "spec.bogus=1", "resourceVersionMatch": "Exact"},
            422,
            'ListOptions.meta.k8s.io "" is invalid',
        ),
        # then the unknown field label, before the resourceVersion and continue token
        ({"fieldSelector": "spec.bogus=1", "resourceVersion": "abc"}, 400, "field label not supported: spec.bogus"),
        ({"fieldSelector": "spec.bogus=1", "continue": "junk"}, 400, "field label not supported: spec.bogus"),
        ({"labelSelector": "a b", "continue": "junk"}, 400, "unable to parse requirement"),
    ],
    ids=[
        "ints",
        "labels",
        "fields-syntax",
        "422",
        "field-label-vs-rv",
        "field-label-vs-continue",
        "labels-vs-continue",
    ],
)
@pytest.mark.parametrize("watch", [False, True], ids=["list", "watch"])
@arun
async def test_several_bad_parameters_get_the_error_kube_checks_first(query, code, starts, watch):
    h = Harness()
    if watch and query.get("continue") and code == 400 and "field label" in starts:
        # A watch from "" with a continue token is refused for the resourceVersionMatch kube defaults
        # it to (SetListOptionsDefaults), checked before the field label (kit: the same 422).
        code, starts = 422, 'ListOptions.meta.k8s.io "" is invalid'
    got = await h.list(**({**query, "watch": "true"} if watch else query))
    assert got.status == code, got.body
    assert got.json()["message"].startswith(starts), got.json()["message"]


def test_an_object_the_cache_encodes_itself_escapes_as_go():
    # An object from the upstream's LIST is encoded here; kube's encoder escapes <, >, & and U+2028/9
    # (seen in a ConfigMap's data: the proxy's GET had them raw where kube's had \u003c...).
    from watchcache.cache.metadata import metadata_json
    from watchcache.cache.object import encode_object
    from watchcache.resources import PODS as pods

    obj = encode_object(pods, {"metadata": {"name": "a", "namespace": "d", "resourceVersion": "3",
                                            "annotations": {"u": "a<b>&c\u2028"}}})  # fmt: skip
    assert b'"u":"a\\u003cb\\u003e\\u0026c\\u2028"' in obj.body
    assert metadata_json(obj, pods) == obj.body[len(b'"metadata":') : obj.body.index(b"}}") + 2]


def test_a_get_at_an_unparsable_resource_version_is_refused_as_kube_refuses_it_for_the_resource():
    # kube-apiserver v1.36, GET .../configmaps/x?resourceVersion=abc: its cacher's 500, no reason (the proxy
    # keeps it a client error: semantics.parse_resource_version); GET .../events/x (no watch cache: etcd's
    # store answers): a 400 in a LIST's words, as the proxy's.
    from watchcache import apierrors
    from watchcache.cache.semantics import plan_get
    from watchcache.resources import CONFIGMAPS, ResourceType

    words = 'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'
    with pytest.raises(apierrors.StatusError) as cached:
        plan_get("abc", from_storage=CONFIGMAPS.uncached_by_kube)
    assert (cached.value.code, cached.value.reason, cached.value.message) == (400, "BadRequest", words)
    for group in ("", "events.k8s.io"):
        events = ResourceType(group, "v1", "events", "Event", True, "event")
        with pytest.raises(apierrors.StatusError) as stored:
            plan_get("abc", from_storage=events.uncached_by_kube)
        assert (stored.value.code, stored.value.reason, stored.value.message) == (
            400,
            "BadRequest",
            f"invalid resource version: {words}",
        )


def _sent(raw: bytes) -> Request:
    """A GET of ``raw`` as the protocols read it (``split_target``)."""
    path, query, utf8 = split_target(raw)
    return Request("GET", raw, path, query, {}, b"", "1.1", "test", query_utf8=utf8)


@pytest.mark.parametrize(
    "raw",
    [
        b"//api/v1/namespaces/default/pods?limit=1",  # kube: its mux's text 404
        b"/api/v1/namespaces/default//pods",  # kube: NotFound Status
        b"/api//v1/namespaces/default/pods/p0?resourceVersion=0",
        b"//api/v1/pods?sendInitialEvents=true",
        b"/api/v1/namespaces/default/pods/..",  # kube: Name parameter invalid
        b"/api/v1/namespaces/default/./pods",
        b"/api/v1/namespaces/default/pods/a%2Fb",  # kube: 404, the name split in two
        b"/api/v1/namespaces/default/pods/p0%00",
        b"/api/v1/namespaces/default/pods/p-%FF",  # kube: NotFound naming the bytes
        b"/api/v1/namespaces/default/pods/p%zz",  # Go: text 400
        b"/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3D%FF",  # kube: an empty list
        b"/api/v1/namespaces/default/pods?labelSelector=i%3D%FF",  # kube: its 400, naming the bytes
    ],
)
@arun
async def test_a_target_kube_reads_otherwise_is_passed_through_as_sent(raw: bytes):
    # In front of an apiserver, the upstream's answer is kube's, byte for byte; the cache's would not be.
    h = Harness()
    h.handler = ApiHandler(h.ctx, forward_tables=True)  # as in front of an apiserver (``service/proxy.py``)
    request = _sent(raw)
    await h.send(request)
    assert h.upstream.forwarded == [request.path]  # (its raw target goes out as sent: ``escaped_target``)
    assert h.handler.passed_through == {"non-canonical": 1}


ALL = [f"p{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        pytest.param(b"?labelSelector=%zz", ALL, id="bad-escape-dropped"),  # kube: every item
        pytest.param(b"?labelSelector=i%3D0;x", ALL, id="semicolon-pair-dropped"),
        pytest.param(b"?limit=1;labelSelector=x", ALL, id="no-limit"),  # kube: not a ParseInt error
        pytest.param(b"?labelSelector=i+%3D+0", ["p0", "p2", "p4"], id="plus-is-space"),
        pytest.param(b"/?labelSelector=i%3D1", ["p1", "p3"], id="trailing-slash"),
    ],
)
@arun
async def test_a_query_is_served_as_gos_parse_query_reads_it(raw: bytes, names: list[str]):
    h = Harness()
    h.handler = ApiHandler(h.ctx, forward_tables=True)
    resp = await h.send(_sent(b"/api/v1/namespaces/default/pods" + raw))
    assert resp.status == 200, resp.body
    doc = resp.json()
    assert [i["metadata"]["name"] for i in doc["items"]] == names and "continue" not in doc["metadata"]
    assert h.upstream.forwarded == [] and h.handler.passed_through == {}


@arun
async def test_a_pair_with_a_bad_escape_is_not_among_the_invalid_options():
    # kube's 422 has one cause: it never saw ``continue=%%%``.
    h = Harness()
    resp = await h.send(_sent(b"/api/v1/namespaces/default/pods?resourceVersionMatch=NotOlderThan&continue=%%%"))
    assert resp.status == 422
    assert [c["field"] for c in resp.json()["details"]["causes"]] == ["resourceVersionMatch"]

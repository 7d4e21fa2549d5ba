"""Answers a client can tell apart from kube-apiserver's, found by the reference tier's differential tests.

Each test states what kube-apiserver v1.36 answered (``tests/reference/test_differential.py``
compares against it live when the kit is there); these run without the kit, on the handler.
"""

from __future__ import annotations

import pytest

from tests.support.handlers import Harness, arun


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

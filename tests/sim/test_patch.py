"""PATCH in the sim: merge patch (RFC 7386), JSON patch (RFC 6902) and the strategic-merge approximation."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.sim.helpers import JSON_PATCH, MERGE, STRATEGIC, pod, raises
from watchcache.cache.object import CachedObject
from watchcache.resources import PODS
from watchcache.sim.cluster import SimCluster
from watchcache.sim.patches import merge_patch


def test_merge_patch_adds_and_removes(sim: SimCluster, web: CachedObject) -> None:
    patch = b'{"metadata":{"labels":{"app":null,"tier":"fe"},"annotations":{"a":"1"}},"status":{"phase":"Running"}}'
    patched = sim.patch(PODS, "default", "web-1", MERGE, patch)
    obj = patched.decode()
    assert obj["metadata"]["labels"] == {"tier": "fe"}
    assert obj["metadata"]["annotations"] == {"a": "1"}
    assert obj["status"]["phase"] == "Running" and obj["spec"] == pod()["spec"]
    assert patched.rv == web.rv + 1 and "kind" not in obj


def test_merge_patch_replaces_lists(sim: SimCluster, web: CachedObject) -> None:
    patched = sim.patch(PODS, "default", "web-1", MERGE, b'{"spec":{"containers":[{"name":"d","image":"x"}]}}')
    assert patched.decode()["spec"]["containers"] == [{"name": "d", "image": "x"}]


def test_merge_patch_content_type_parameters_are_ignored(sim: SimCluster, web: CachedObject) -> None:
    sim.patch(PODS, "default", "web-1", "application/merge-patch+json; charset=utf-8", b'{"metadata":{"labels":{}}}')


def test_merge_patch_resource_version_is_a_precondition(sim: SimCluster, web: CachedObject) -> None:
    stale = f'{{"metadata":{{"resourceVersion":"{web.rv - 1}","labels":{{"x":"1"}}}}}}'.encode()
    raises(409, "Conflict", sim.patch, PODS, "default", "web-1", MERGE, stale)
    fresh = f'{{"metadata":{{"resourceVersion":"{web.rv}","labels":{{"x":"1"}}}}}}'.encode()
    assert sim.patch(PODS, "default", "web-1", MERGE, fresh).labels == {"app": "web", "x": "1"}


def test_patch_cannot_rename_move_or_change_uid(sim: SimCluster, web: CachedObject) -> None:
    err = raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", MERGE, b'{"metadata":{"name":"other"}}')
    assert err.message == "the name of the object (other) does not match the name on the URL (web-1)"
    raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", MERGE, b'{"metadata":{"namespace":"kube-system"}}')
    raises(422, "Invalid", sim.patch, PODS, "default", "web-1", MERGE, b'{"metadata":{"uid":"x"}}')
    raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", MERGE, b'{"kind":"Node"}')
    assert sim.rv == web.rv


@pytest.mark.parametrize("body", [b"{", b"", b"not json"])
@pytest.mark.parametrize("patch_type", [MERGE, JSON_PATCH, STRATEGIC])
def test_patch_invalid_json_is_bad_request(sim: SimCluster, web: CachedObject, body: bytes, patch_type: str) -> None:
    raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", patch_type, body)


def test_merge_patch_must_be_an_object(sim: SimCluster, web: CachedObject) -> None:
    raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", MERGE, b"[1]")


@pytest.mark.parametrize("patch_type", ["application/apply-patch+yaml", "application/json", "text/plain"])
def test_unsupported_patch_types(sim: SimCluster, web: CachedObject, patch_type: str) -> None:
    raises(415, "UnsupportedMediaType", sim.patch, PODS, "default", "web-1", patch_type, b"{}")


def test_patch_missing_is_not_found(sim: SimCluster) -> None:
    raises(404, "NotFound", sim.patch, PODS, "default", "ghost", MERGE, b"{}")


def test_json_patch(sim: SimCluster, web: CachedObject) -> None:
    ops = [
        {"op": "test", "path": "/kind", "value": "Pod"},
        {"op": "add", "path": "/metadata/labels/tier", "value": "fe"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:2"},
        {"op": "remove", "path": "/metadata/labels/app"},
    ]
    obj = sim.patch(PODS, "default", "web-1", JSON_PATCH, orjson.dumps(ops)).decode()
    assert obj["metadata"]["labels"] == {"tier": "fe"}
    assert obj["spec"]["containers"][0]["image"] == "nginx:2"


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/metadata/name", "value": "other"}],
        [{"op": "remove", "path": "/metadata/labels/missing"}],
        [{"op": "replace", "path": "/spec/containers/7/image", "value": "x"}],
    ],
)
def test_json_patch_that_does_not_apply_is_unprocessable(sim: SimCluster, web: CachedObject, ops: Any) -> None:
    raises(422, "Invalid", sim.patch, PODS, "default", "web-1", JSON_PATCH, orjson.dumps(ops))
    assert sim.rv == web.rv


@pytest.mark.parametrize(
    "ops", [{"op": "add"}, [{"op": "bogus", "path": "/a"}], [{"path": "/a"}], [{"op": "add", "path": "/a"}], ["x"]]
)
def test_malformed_json_patch_is_bad_request(sim: SimCluster, web: CachedObject, ops: Any) -> None:
    raises(400, "BadRequest", sim.patch, PODS, "default", "web-1", JSON_PATCH, orjson.dumps(ops))


def test_json_patch_resource_version_is_a_precondition(sim: SimCluster, web: CachedObject) -> None:
    ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]
    raises(409, "Conflict", sim.patch, PODS, "default", "web-1", JSON_PATCH, orjson.dumps(ops))


def test_strategic_merge_patch_drops_directives(sim: SimCluster, web: CachedObject) -> None:
    patch = {
        "metadata": {"labels": {"tier": "fe"}, "$retainKeys": ["labels"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "c"}],
            "containers": [{"name": "c", "image": "nginx:3"}, {"name": "gone", "$patch": "delete"}],
            "securityContext": {"$patch": "delete"},
        },
    }
    obj = sim.patch(PODS, "default", "web-1", STRATEGIC, orjson.dumps(patch)).decode()
    assert obj["metadata"]["labels"] == {"app": "web", "tier": "fe"}
    assert obj["spec"] == {"containers": [{"name": "c", "image": "nginx:3"}]}
    assert b"$" not in orjson.dumps(obj)


def test_strategic_patch_delete_removes_a_map(sim: SimCluster, web: CachedObject) -> None:
    sim.patch(PODS, "default", "web-1", MERGE, b'{"metadata":{"annotations":{"a":"1"}}}')
    obj = sim.patch(PODS, "default", "web-1", STRATEGIC, b'{"metadata":{"annotations":{"$patch":"delete"}}}').decode()
    assert "annotations" not in obj["metadata"]


# RFC 7386 appendix A, verbatim.
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result

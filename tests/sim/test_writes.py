"""handle_write: the HTTP-independent write entry (methods, status codes, typed bodies, preconditions)."""

from __future__ import annotations

import orjson
import pytest

from tests.sim.helpers import MERGE, meta_of, pod, raises
from watchcache.cache.object import CachedObject
from watchcache.resources import NODES, PODS
from watchcache.sim.cluster import SimCluster
from watchcache.sim.writes import handle_write


def test_handle_write_round_trip(sim: SimCluster) -> None:
    code, body = handle_write(sim, "POST", PODS, "default", "", "application/json", orjson.dumps(pod()))
    assert code == 201 and body.startswith(PODS.typed_prefix)
    obj = orjson.loads(body)
    assert (obj["kind"], obj["apiVersion"], obj["metadata"]["name"]) == ("Pod", "v1", "web-1")
    obj["metadata"]["labels"] = {"v": "2"}
    code, body = handle_write(sim, "PUT", PODS, "default", "web-1", "application/json", orjson.dumps(obj))
    assert code == 200 and orjson.loads(body)["metadata"]["labels"] == {"v": "2"}
    code, body = handle_write(sim, "PATCH", PODS, "default", "web-1", MERGE, b'{"metadata":{"labels":{"v":"3"}}}')
    assert code == 200 and orjson.loads(body)["metadata"]["labels"] == {"v": "3"}
    code, body = handle_write(sim, "DELETE", PODS, "default", "web-1", "", b"")
    assert code == 200 and orjson.loads(body)["metadata"]["resourceVersion"] == str(sim.rv)
    assert sim.get(PODS, "default", "web-1") is None


def test_handle_write_cluster_scoped_create(sim: SimCluster) -> None:
    code, body = handle_write(sim, "POST", NODES, "", "", "", b'{"metadata":{"name":"n"}}')
    assert code == 201 and orjson.loads(body)["kind"] == "Node"


@pytest.mark.parametrize(
    ("method", "name", "action"),
    [
        ("POST", "web-1", "create"),
        ("PUT", "", "update"),
        ("PATCH", "", "patch"),
        ("DELETE", "", "deletecollection"),
        ("OPTIONS", "web-1", "options"),
    ],
)
def test_handle_write_methods_not_allowed(sim: SimCluster, method: str, name: str, action: str) -> None:
    err = raises(405, "MethodNotAllowed", handle_write, sim, method, PODS, "default", name, MERGE, b"{}")
    assert err.message == f'{action} is not supported on resources of kind "pods"'


def test_handle_write_create_needs_a_namespace_for_namespaced_types(sim: SimCluster) -> None:
    raises(405, "MethodNotAllowed", handle_write, sim, "POST", PODS, "", "", "", orjson.dumps(pod()))


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"1", b"{", b""])
@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_handle_write_body_must_be_an_object(sim: SimCluster, web: CachedObject, method: str, body: bytes) -> None:
    name = "" if method == "POST" else "web-1"
    raises(400, "BadRequest", handle_write, sim, method, PODS, "default", name, "application/json", body)


def test_handle_write_rejects_non_json_bodies(sim: SimCluster) -> None:
    raises(415, "UnsupportedMediaType", handle_write, sim, "POST", PODS, "default", "", "application/yaml", b"{}")


def test_handle_write_delete_preconditions(sim: SimCluster, web: CachedObject) -> None:
    stale = orjson.dumps({"preconditions": {"resourceVersion": "1"}})
    err = raises(409, "Conflict", handle_write, sim, "DELETE", PODS, "default", "web-1", "application/json", stale)
    assert "Precondition failed: ResourceVersion in precondition: 1" in err.message
    wrong_uid = orjson.dumps({"preconditions": {"uid": "nope"}})
    raises(409, "Conflict", handle_write, sim, "DELETE", PODS, "default", "web-1", "application/json", wrong_uid)
    assert sim.get(PODS, "default", "web-1") is web
    good = orjson.dumps({"preconditions": {"uid": meta_of(web)["uid"], "resourceVersion": str(web.rv)}})
    assert handle_write(sim, "DELETE", PODS, "default", "web-1", "application/json", good)[0] == 200

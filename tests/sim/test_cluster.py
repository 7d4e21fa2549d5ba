"""The sim's write path: kube-apiserver's codes, reasons and server-set fields, one global revision."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest

from tests.sim.helpers import MERGE, WALL, deployment, meta_of, pod, raises
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.resources import (
    CONFIGMAPS,
    DEPLOYMENTS,
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    ResourceRegistry,
    ResourceType,
)
from watchcache.sim.cluster import INITIAL_NAMESPACES, SimCluster
from watchcache.sim.fixtures import make_configmap, make_namespace, make_node, make_pod

# ---------------------------------------------------------------------- initial state and the revision


def test_starts_ready_with_the_system_namespaces_at_one_revision(sim: SimCluster) -> None:
    names = [o.name for o in sim.cachers[NAMESPACES].cache.snapshot().iter_range("", None)]
    assert sorted(names) == sorted(INITIAL_NAMESPACES)
    assert sim.rv == 1 + len(INITIAL_NAMESPACES)
    assert sim.commits() == len(INITIAL_NAMESPACES)
    assert all(c.ready and c.rv == sim.rv for c in sim.cachers.values())
    assert set(sim.cachers) == set(sim.registry.types)


def test_global_revision_is_one_counter_across_resources(sim: SimCluster) -> None:
    seen = []
    for resource, namespace, obj in [
        (CONFIGMAPS, "default", {"metadata": {"name": "a"}, "data": {"k": "v"}}),
        (PODS, "default", pod()),
        (NODES, "", {"metadata": {"name": "n1"}}),
        (DEPLOYMENTS, "default", deployment()),
    ]:
        before = sim.rv
        created = sim.create(resource, namespace, obj)
        assert created.rv == before + 1 == sim.rv
        assert meta_of(created)["resourceVersion"] == str(sim.rv)
        # Every other type's list RV moves too (a progress notification), as etcd's quorum reads would report.
        assert {c.rv for c in sim.cachers.values()} == {sim.rv}
        seen.append(created.rv)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_other_cachers_advance_by_progress_without_events(sim: SimCluster) -> None:
    before = len(sim.cachers[NODES].cache.history)
    sim.create(PODS, "default", pod())
    assert sim.cachers[NODES].rv == sim.rv
    assert len(sim.cachers[NODES].cache.history) == before
    assert sim.cachers[NODES].cache.events_since(sim.rv - 1) == []


def test_listener_gets_exactly_the_applied_changes(sim: SimCluster) -> None:
    calls: list[tuple[ResourceType, list[tuple[str, CachedObject]], int]] = []
    sim.subscribe(lambda r, changes, rv: calls.append((r, changes, rv)))
    created = sim.create(PODS, "default", pod())
    sim.patch(PODS, "default", "web-1", MERGE, b'{"metadata":{"labels":{"x":"y"}}}')
    deleted = sim.delete(PODS, "default", "web-1")
    assert [(r, [t for t, _ in ch], rv) for r, ch, rv in calls] == [
        (PODS, [ADDED], created.rv),
        (PODS, [MODIFIED], created.rv + 1),
        (PODS, [DELETED], deleted.rv),
    ]
    assert calls[0][1][0][1] is created
    history = list(sim.cachers[PODS].cache.history)
    assert [e.object for e in history] == [ch[0][1] for _, ch, _ in calls]
    assert sim.commits() == len(INITIAL_NAMESPACES) + 3


# ---------------------------------------------------------------------- create


def test_create_sets_server_fields(sim: SimCluster) -> None:
    body = pod(kind="Pod", apiVersion="v1")
    body["metadata"]["uid"] = "client-chosen"
    body["metadata"]["creationTimestamp"] = "2001-01-01T00:00:00Z"
    created = sim.create(PODS, "default", body)
    obj = created.decode()
    meta = obj["metadata"]
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", meta["uid"])
    assert meta["creationTimestamp"] == "2023-11-14T22:13:20Z"
    assert meta["namespace"] == "default"
    assert obj["status"] == {"phase": "Pending"}
    assert "kind" not in obj and "apiVersion" not in obj
    assert created.key == "default/web-1" and created.fields["status.phase"] == "Pending"
    assert sim.get(PODS, "default", "web-1") is created


def test_create_keeps_a_given_pod_phase(sim: SimCluster) -> None:
    created = sim.create(PODS, "default", pod(status={"phase": "Running"}))
    assert created.fields["status.phase"] == "Running"


def test_uids_are_unique_and_reproducible_with_a_seed() -> None:
    def uids(seed: int) -> list[str]:
        sim = SimCluster(seed=seed, wall_clock=lambda: WALL)
        return [meta_of(sim.create(PODS, "default", pod(f"p{i}")))["uid"] for i in range(5)]

    assert uids(1) == uids(1)
    assert uids(1) != uids(2)
    assert len(set(uids(1))) == 5


def test_create_namespace_defaults(sim: SimCluster) -> None:
    obj = sim.create(NAMESPACES, "", {"metadata": {"name": "team-a", "namespace": "ignored"}}).decode()
    assert obj["status"] == {"phase": "Active"}
    assert obj["spec"] == {"finalizers": ["kubernetes"]}
    assert obj["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}
    assert "namespace" not in obj["metadata"]


def test_create_cluster_scoped_drops_namespace(sim: SimCluster) -> None:
    created = sim.create(NODES, "", {"metadata": {"name": "node-a", "namespace": "default"}})
    assert created.key == "node-a" and created.namespace == ""
    assert "namespace" not in meta_of(created)


def test_create_deployment_generation_is_one(sim: SimCluster) -> None:
    body = deployment()
    body["metadata"]["generation"] = 9
    assert meta_of(sim.create(DEPLOYMENTS, "default", body))["generation"] == 1


def test_create_requires_name_or_generate_name(sim: SimCluster) -> None:
    err = raises(422, "Invalid", sim.create, PODS, "default", {"metadata": {}})
    assert err.message == 'Pod "" is invalid: metadata.name: Required value: name or generateName is required'
    assert err.details is not None and err.details["causes"][0]["field"] == "metadata.name"
    assert err.details["causes"][0]["reason"] == "FieldValueRequired"
    raises(422, "Invalid", sim.create, PODS, "default", {})


@pytest.mark.parametrize("name", ["Web", "web_1", "-web", "web-", "a" * 254, "web..x"])
def test_create_rejects_names_that_are_not_dns_subdomains(sim: SimCluster, name: str) -> None:
    err = raises(422, "Invalid", sim.create, PODS, "default", pod(name))
    assert err.message.startswith(f'Pod "{name}" is invalid: metadata.name: Invalid value: "{name}": ')
    assert sim.get(PODS, "default", name) is None


def test_create_accepts_dotted_names_and_the_maximum_length(sim: SimCluster) -> None:
    sim.create(PODS, "default", pod("web.v1.example"))
    sim.create(PODS, "default", pod("a" * 253))


def test_namespace_and_service_names_are_labels(sim: SimCluster) -> None:
    err = raises(422, "Invalid", sim.create, NAMESPACES, "", {"metadata": {"name": "a.b"}})
    assert "RFC 1123 label" in err.message
    raises(422, "Invalid", sim.create, NAMESPACES, "", {"metadata": {"name": "a" * 64}})
    err = raises(422, "Invalid", sim.create, SERVICES, "default", {"metadata": {"name": "1svc"}})
    assert "DNS-1035 label" in err.message


def test_generate_name(sim: SimCluster) -> None:
    created = sim.create(PODS, "default", {"metadata": {"generateName": "web-"}})
    assert re.fullmatch(r"web-[bcdfghjklmnpqrstvwxz2456789]{5}", created.name)
    assert meta_of(created)["generateName"] == "web-"
    other = sim.create(PODS, "default", {"metadata": {"generateName": "web-"}})
    assert other.name != created.name


def test_generate_name_prefix_is_truncated_to_fit_a_label(sim: SimCluster) -> None:
    created = sim.create(NAMESPACES, "", {"metadata": {"generateName": "x" * 80}})
    assert len(created.name) == 63 and created.name.startswith("x" * 58)


def test_generate_name_must_make_a_valid_name(sim: SimCluster) -> None:
    raises(422, "Invalid", sim.create, PODS, "default", {"metadata": {"generateName": "Web-"}})


def test_create_namespace_mismatch_is_bad_request(sim: SimCluster) -> None:
    err = raises(400, "BadRequest", sim.create, PODS, "default", pod(namespace="kube-system"))
    assert err.message == "the namespace of the provided object does not match the namespace sent on the request"


def test_create_body_namespace_equal_to_url_is_fine(sim: SimCluster) -> None:
    assert sim.create(PODS, "kube-system", pod(namespace="kube-system")).key == "kube-system/web-1"


def test_create_in_missing_namespace_is_not_found(sim: SimCluster) -> None:
    err = raises(404, "NotFound", sim.create, PODS, "nope", pod())
    assert err.message == 'namespaces "nope" not found'


def test_create_namespaced_without_namespace_is_invalid(sim: SimCluster) -> None:
    err = raises(422, "Invalid", sim.create, PODS, "", pod())
    assert "metadata.namespace: Required value" in err.message


def test_create_existing_is_already_exists(sim: SimCluster) -> None:
    sim.create(PODS, "default", pod())
    rv = sim.rv
    err = raises(409, "AlreadyExists", sim.create, PODS, "default", pod())
    assert err.message == 'pods "web-1" already exists'
    assert sim.rv == rv
    # The same name in another namespace is another object.
    sim.create(PODS, "kube-system", pod())
    sim.create(DEPLOYMENTS, "default", deployment("d"))
    err = raises(409, "AlreadyExists", sim.create, DEPLOYMENTS, "default", deployment("d"))
    assert err.message == 'deployments.apps "d" already exists'


def test_create_checks_type_meta(sim: SimCluster) -> None:
    err = raises(400, "BadRequest", sim.create, PODS, "default", pod(kind="Service"))
    assert err.message.startswith('Service in version "v1" cannot be handled as a Pod')
    err = raises(400, "BadRequest", sim.create, DEPLOYMENTS, "default", {**deployment(), "apiVersion": "v1"})
    assert err.message == "the API version in the data (v1) does not match the expected API version (apps/v1)"
    sim.create(DEPLOYMENTS, "default", {**deployment(), "kind": "Deployment", "apiVersion": "apps/v1"})


def test_create_with_resource_version_is_refused(sim: SimCluster) -> None:
    body = pod()
    body["metadata"]["resourceVersion"] = "3"
    err = raises(500, "InternalError", sim.create, PODS, "default", body)
    assert "resourceVersion should not be set on objects to be created" in err.message


@pytest.mark.parametrize(
    "metadata", ["x", {"name": 5}, {"name": "a", "labels": ["x"]}, {"name": "a", "annotations": {"k": 1}}]
)
def test_create_with_undecodable_metadata_is_bad_request(sim: SimCluster, metadata: Any) -> None:
    raises(400, "BadRequest", sim.create, PODS, "default", {"metadata": metadata})


def test_unknown_resource_is_not_found() -> None:
    sim = SimCluster(ResourceRegistry((NAMESPACES, PODS)), wall_clock=lambda: WALL)
    raises(404, "NotFound", sim.create, CONFIGMAPS, "default", {"metadata": {"name": "a"}})


def test_without_a_namespaces_resource_any_namespace_is_accepted() -> None:
    sim = SimCluster(ResourceRegistry((PODS,)), wall_clock=lambda: WALL)
    assert sim.rv == 1 and sim.commits() == 0
    assert sim.create(PODS, "anything", pod()).key == "anything/web-1"


# ---------------------------------------------------------------------- update


def test_update_replaces_and_keeps_identity(sim: SimCluster) -> None:
    created = sim.create(PODS, "default", pod())
    body = created.decode()
    body["metadata"]["labels"] = {"app": "api"}
    body["metadata"]["creationTimestamp"] = "2001-01-01T00:00:00Z"
    del body["metadata"]["uid"]
    updated = sim.update(PODS, "default", "web-1", body)
    meta = meta_of(updated)
    assert updated.rv == created.rv + 1 and meta["resourceVersion"] == str(updated.rv)
    assert meta["uid"] == meta_of(created)["uid"]
    assert meta["creationTimestamp"] == meta_of(created)["creationTimestamp"]
    assert updated.labels == {"app": "api"}
    assert [e.type for e in sim.cachers[PODS].cache.events_since(created.rv)] == [MODIFIED]


def test_update_missing_is_not_found(sim: SimCluster) -> None:
    err = raises(404, "NotFound", sim.update, PODS, "default", "ghost", pod("ghost"))
    assert err.message == 'pods "ghost" not found'


def test_update_with_stale_resource_version_conflicts(sim: SimCluster) -> None:
    created = sim.create(PODS, "default", pod())
    stale = created.decode()
    sim.patch(PODS, "default", "web-1", MERGE, b'{"metadata":{"labels":{"v":"2"}}}')
    rv = sim.rv
    err = raises(409, "Conflict", sim.update, PODS, "default", "web-1", stale)
    assert err.message == (
        'Operation cannot be fulfilled on pods "web-1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert sim.rv == rv


def test_update_without_resource_version_is_unconditional(sim: SimCluster) -> None:
    sim.create(PODS, "default", pod())
    sim.patch(PODS, "default", "web-1", MERGE, b'{"metadata":{"labels":{"v":"2"}}}')
    assert sim.update(PODS, "default", "web-1", pod(status={"phase": "Running"})).fields["status.phase"] == "Running"


def test_update_name_must_match_url(sim: SimCluster) -> None:
    sim.create(PODS, "default", pod())
    err = raises(400, "BadRequest", sim.update, PODS, "default", "web-1", pod("web-2"))
    assert err.message == "the name of the object (web-2) does not match the name on the URL (web-1)"
    raises(400, "BadRequest", sim.update, PODS, "default", "web-1", pod(namespace="kube-system"))


def test_update_cannot_change_uid(sim: SimCluster) -> None:
    sim.create(PODS, "default", pod())
    body = pod()
    body["metadata"]["uid"] = "other"
    err = raises(422, "Invalid", sim.update, PODS, "default", "web-1", body)
    assert err.message == 'Pod "web-1" is invalid: metadata.uid: Invalid value: "other": field is immutable'


def test_update_that_changes_nothing_is_not_a_commit(sim: SimCluster) -> None:
    created = sim.create(PODS, "default", pod())
    commits = sim.commits()
    same = sim.update(PODS, "default", "web-1", created.decode())
    assert same is created and sim.commits() == commits and sim.rv == created.rv


def test_deployment_generation_bumps_only_on_spec_change(sim: SimCluster) -> None:
    sim.create(DEPLOYMENTS, "default", deployment())
    labelled = deployment()
    labelled["metadata"]["labels"] = {"a": "b"}
    assert meta_of(sim.update(DEPLOYMENTS, "default", "web", labelled))["generation"] == 1
    scaled = deployment(replicas=3)
    scaled["metadata"]["generation"] = 40
    assert meta_of(sim.update(DEPLOYMENTS, "default", "web", scaled))["generation"] == 2
    assert meta_of(sim.patch(DEPLOYMENTS, "default", "web", MERGE, b'{"spec":{"replicas":5}}'))["generation"] == 3


def test_namespace_update_keeps_spec_and_status(sim: SimCluster) -> None:
    sim.create(NAMESPACES, "", make_namespace("team-a"))
    obj = sim.update(NAMESPACES, "", "team-a", {"metadata": {"name": "team-a"}, "status": {"phase": "X"}}).decode()
    assert obj["status"] == {"phase": "Active"} and obj["spec"] == {"finalizers": ["kubernetes"]}
    assert obj["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}


# ---------------------------------------------------------------------- delete


def test_delete_returns_the_object_at_the_deletion_revision(sim: SimCluster, web: CachedObject) -> None:
    deleted = sim.delete(PODS, "default", "web-1")
    assert deleted.rv == web.rv + 1 == sim.rv
    assert meta_of(deleted)["resourceVersion"] == str(deleted.rv)
    assert meta_of(deleted)["uid"] == meta_of(web)["uid"]
    assert sim.get(PODS, "default", "web-1") is None
    events = sim.cachers[PODS].cache.events_since(web.rv)
    assert [(e.type, e.rv, e.prev) for e in events] == [(DELETED, deleted.rv, web)]


def test_delete_missing_is_not_found(sim: SimCluster) -> None:
    err = raises(404, "NotFound", sim.delete, DEPLOYMENTS, "default", "ghost")
    assert err.message == 'deployments.apps "ghost" not found'


def test_deleting_a_namespace_deletes_its_contents_one_commit_each(sim: SimCluster) -> None:
    rng = random.Random(1)
    sim.create(NAMESPACES, "", make_namespace("team-a"))
    sim.create(NAMESPACES, "", make_namespace("team-ab"))  # shares a prefix: must survive
    for i in range(3):
        sim.create(PODS, "team-a", make_pod(f"p{i}", "team-a", "node-0", rng))
    sim.create(CONFIGMAPS, "team-a", make_configmap("cfg", "team-a", rng))
    survivor = sim.create(PODS, "team-ab", make_pod("p0", "team-ab", "node-0", rng))
    calls: list[tuple[str, str, str, int]] = []
    sim.subscribe(lambda r, ch, rv: calls.extend((r.resource, t, o.key, rv) for t, o in ch))
    before = sim.rv
    deleted = sim.delete(NAMESPACES, "", "team-a")
    assert [c[1] for c in calls] == [DELETED] * 5
    assert [c[3] for c in calls] == list(range(before + 1, before + 6))
    assert calls[-1][:3] == ("namespaces", DELETED, "team-a")
    assert sorted(c[2] for c in calls[:-1]) == ["team-a/cfg", "team-a/p0", "team-a/p1", "team-a/p2"]
    assert deleted.rv == sim.rv == before + 5
    assert sim.get(PODS, "team-ab", "p0") is survivor
    assert len(sim.cachers[PODS].cache) == 1 and len(sim.cachers[CONFIGMAPS].cache) == 0
    raises(404, "NotFound", sim.create, PODS, "team-a", pod())


@pytest.mark.parametrize("name", ["default", "kube-system", "kube-public"])
def test_system_namespaces_cannot_be_deleted(sim: SimCluster, name: str) -> None:
    err = raises(403, "Forbidden", sim.delete, NAMESPACES, "", name)
    assert err.message == f'namespaces "{name}" is forbidden: this namespace may not be deleted'


def test_compact_drops_history_everywhere(sim: SimCluster, web: CachedObject) -> None:
    sim.patch(PODS, "default", "web-1", MERGE, b'{"metadata":{"labels":{"v":"2"}}}')
    assert sim.compact() == sim.rv
    for cacher in sim.cachers.values():
        assert len(cacher.cache.history) == 0 and cacher.cache.oldest_rv == sim.rv
    with pytest.raises(ResourceVersionTooOld):
        sim.cachers[PODS].cache.events_since(web.rv)
    # Still writable, and new history starts after the compaction.
    sim.delete(PODS, "default", "web-1")
    assert len(sim.cachers[PODS].cache.events_since(sim.rv - 1)) == 1


# ---------------------------------------------------------------------- fixtures


def test_pod_fixture_is_about_three_kilobytes_and_deterministic() -> None:
    sizes = [len(orjson.dumps(make_pod(f"web-{i}", "ns-1", "node-1", random.Random(i)))) for i in range(50)]
    assert all(2048 <= s <= 4096 for s in sizes), sizes
    assert 2500 <= sum(sizes) / len(sizes) <= 3500
    assert make_pod("a", "b", "c", random.Random(3)) == make_pod("a", "b", "c", random.Random(3))
    assert make_pod("a", "b", "c", random.Random(3)) != make_pod("a", "b", "c", random.Random(4))


def test_fixtures_are_accepted_by_the_sim(sim: SimCluster) -> None:
    rng = random.Random(0)
    sim.create(NODES, "", make_node("node-0", rng))
    sim.create(NAMESPACES, "", make_namespace("ns-0"))
    sim.create(CONFIGMAPS, "ns-0", make_configmap("cfg", "ns-0", rng))
    created = sim.create(PODS, "ns-0", make_pod("web-0", "ns-0", "node-0", rng))
    assert created.fields["spec.nodeName"] == "node-0" and created.fields["status.phase"] == "Running"
    assert 2048 <= len(created.body) <= 4096

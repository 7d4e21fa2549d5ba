"""The official ``kubernetes`` Python client against the simulated cluster and the service."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from harness.processes import Proc

TIMEOUT = 10


@pytest.fixture
def v1(api: Proc) -> Iterator[client.CoreV1Api]:
    config = client.Configuration()
    config.host = api.url
    config.retries = 0
    with client.ApiClient(config) as api_client:
        yield client.CoreV1Api(api_client)


def test_paged_list_collects_every_pod_once_at_one_resource_version(v1: client.CoreV1Api) -> None:
    full = v1.list_pod_for_all_namespaces(_request_timeout=TIMEOUT)
    expected = Counter((p.metadata.namespace, p.metadata.name) for p in full.items)
    assert len(full.items) == 120

    seen: Counter[tuple[str, str]] = Counter()
    versions = set()
    pages = 0
    token = None
    while True:
        page = v1.list_pod_for_all_namespaces(limit=25, _continue=token, _request_timeout=TIMEOUT)
        pages += 1
        assert len(page.items) <= 25
        versions.add(page.metadata.resource_version)
        seen.update((p.metadata.namespace, p.metadata.name) for p in page.items)
        token = page.metadata._continue
        if not token:
            assert page.metadata.remaining_item_count is None
            break
        assert page.metadata.remaining_item_count == 120 - sum(seen.values())
        assert pages < 10, "paging does not end"
    assert pages == 5  # 120 pods, 25 a page
    assert len(versions) == 1, versions
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]
    assert seen == expected


def test_label_and_field_selectors_return_exactly_the_matching_pods(v1: client.CoreV1Api) -> None:
    everything = v1.list_namespaced_pod("ns-0", _request_timeout=TIMEOUT).items
    assert everything, "ns-0 has no pods"

    by_label = v1.list_namespaced_pod("ns-0", label_selector="app=auth,tier", _request_timeout=TIMEOUT).items
    assert by_label, "no pod of app=auth in ns-0"
    for p in by_label:
        assert p.metadata.namespace == "ns-0"
        assert p.metadata.labels["app"] == "auth"
        assert "tier" in p.metadata.labels
    assert {p.metadata.name for p in by_label} == {
        p.metadata.name for p in everything if (p.metadata.labels or {}).get("app") == "auth"
    }

    not_auth = v1.list_namespaced_pod("ns-0", label_selector="app notin (auth, catalog)", _request_timeout=TIMEOUT)
    assert {p.metadata.name for p in not_auth.items} == {
        p.metadata.name for p in everything if (p.metadata.labels or {}).get("app") not in ("auth", "catalog")
    }

    on_node = v1.list_namespaced_pod("ns-0", field_selector="spec.nodeName=node-1", _request_timeout=TIMEOUT).items
    assert on_node, "no pod of ns-0 on node-1"
    for p in on_node:
        assert p.metadata.namespace == "ns-0"
        assert p.spec.node_name == "node-1"
    assert {p.metadata.name for p in on_node} == {p.metadata.name for p in everything if p.spec.node_name == "node-1"}

    both = v1.list_namespaced_pod(
        "ns-0", label_selector="tier", field_selector="spec.nodeName!=node-1,status.phase=Running", _request_timeout=10
    ).items
    assert {p.metadata.name for p in both} == {
        p.metadata.name for p in everything if p.spec.node_name != "node-1" and p.status.phase == "Running"
    }


def test_watch_receives_added_modified_deleted_in_order(api: Proc, v1: client.CoreV1Api) -> None:
    start_rv = v1.list_namespaced_config_map("ns-1", _request_timeout=TIMEOUT).metadata.resource_version

    # A separate client for the writes: the watch holds its own connection.
    config = client.Configuration()
    config.host = api.url
    config.retries = 0
    with client.ApiClient(config) as writer_client:
        writer = client.CoreV1Api(writer_client)
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="e2e-py"), data={"n": "0"})
        created = writer.create_namespaced_config_map("ns-1", body, _request_timeout=TIMEOUT)
        written = {"ADDED": created.metadata.resource_version}

        w = watch.Watch()
        events = []
        for event in w.stream(
            v1.list_namespaced_config_map,
            namespace="ns-1",
            resource_version=start_rv,
            timeout_seconds=TIMEOUT,
            _request_timeout=TIMEOUT,
        ):
            obj = event["object"]
            events.append((event["type"], obj.metadata.name, int(obj.metadata.resource_version)))
            if obj.metadata.name != "e2e-py":
                continue
            if event["type"] == "ADDED":
                assert obj.data == {"n": "0"}
                patched = writer.patch_namespaced_config_map(
                    "e2e-py", "ns-1", {"data": {"n": "1"}}, _request_timeout=TIMEOUT
                )
                written["MODIFIED"] = patched.metadata.resource_version
            elif event["type"] == "MODIFIED":
                assert obj.data == {"n": "1"}
                status = writer.delete_namespaced_config_map("e2e-py", "ns-1", _request_timeout=TIMEOUT)
                assert status is not None
                written["DELETED"] = None
            elif event["type"] == "DELETED":
                w.stop()
    assert [(t, n) for t, n, _ in events] == [("ADDED", "e2e-py"), ("MODIFIED", "e2e-py"), ("DELETED", "e2e-py")]
    rvs = [rv for _, _, rv in events]
    assert all(a < b for a, b in itertools.pairwise(rvs)), rvs
    assert rvs[0] > int(start_rv)
    assert str(rvs[0]) == written["ADDED"]
    assert str(rvs[1]) == written["MODIFIED"]


def test_get_missing_pod_is_404(v1: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as info:
        v1.read_namespaced_pod("no-such-pod", "ns-0", _request_timeout=TIMEOUT)
    assert info.value.status == 404
    assert info.value.reason == "Not Found"
    assert '"reason":"NotFound"' in info.value.body.replace(" ", "")
    assert 'pods \\"no-such-pod\\" not found' in info.value.body

"""Real clients through the caching proxy: kubectl (the dev extra's, v1.37) and the ``kubernetes`` Python client.

Everything a client does through the proxy is checked against the upstream ``watchcache sim`` directly.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from harness.processes import Stack, start_stack
from harness.tools import KUBECTL_INSTALL, require
from tests.support.httpkube import get, get_ok, key_of, rv_of
from tests.support.kubectl import pods_requests

TIMEOUT = 10


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The proxy caching pods and configmaps in front of a sim of 120 pods in 3 namespaces."""
    s = start_stack("--resources", "pods,configmaps")
    try:
        yield s
        assert s.proxy.process.poll() is None, "the proxy died:\n" + "".join(s.proxy.log[-40:])
    finally:
        try:
            s.proxy.stop()
        finally:
            s.sim.stop()


class Kubectl:
    """kubectl with an empty kubeconfig and its own HOME and cache: nothing of the user's takes part."""

    def __init__(self, home: Path) -> None:
        self.exe = require("kubectl", KUBECTL_INSTALL)
        kubeconfig = home / "kubeconfig"
        kubeconfig.write_text("")
        self.cache_dir = home / "kube-cache"
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(kubeconfig)}

    def run(self, server: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [self.exe, "--server", server, "--cache-dir", str(self.cache_dir), "--request-timeout=10s", *args]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)} against {server} failed:\n{result.stderr}"
        return result


@pytest.fixture
def kubectl(tmp_path: Path) -> Kubectl:
    return Kubectl(tmp_path)


# ---------------------------------------------------------------------------------------------- kubectl


def test_kubectl_chunked_get_of_all_pods(stack: Stack, kubectl: Kubectl) -> None:
    result = kubectl.run(stack.proxy.url, "get", "pods", "-A", "--chunk-size=50", "-o", "name", "-v=6")
    lines = result.stdout.split()
    assert all(line.startswith("pod/") for line in lines), lines[:5]
    names = Counter(line.removeprefix("pod/") for line in lines)
    expected = Counter(item["metadata"]["name"] for item in get_ok(stack.sim.url, "/api/v1/pods")["items"])
    assert sum(expected.values()) == 120
    assert names == expected
    # It paged, through the proxy: 120 pods at 50 a page is a first request and two continues.
    requests = pods_requests(result.stderr)
    assert {server for server, _ in requests} == {stack.proxy.url}, requests
    assert len(requests) == 3, requests
    assert all("limit=50" in query for _, query in requests)
    assert sum("continue=" in query for _, query in requests) == 2


def test_kubectl_get_pods_in_a_namespace_prints_what_it_prints_against_the_upstream(
    stack: Stack, kubectl: Kubectl
) -> None:
    through = kubectl.run(stack.proxy.url, "get", "pods", "-n", "ns-1").stdout.splitlines()
    direct = kubectl.run(stack.sim.url, "get", "pods", "-n", "ns-1").stdout.splitlines()
    assert through[0] == direct[0], "a different header through the proxy"
    assert through[0].split()[0] == "NAME"
    expected = sorted(i["metadata"]["name"] for i in get_ok(stack.sim.url, "/api/v1/namespaces/ns-1/pods")["items"])
    assert sorted(line.split()[0] for line in through[1:]) == expected
    assert len(expected) == 40


def manifest(path: Path, data: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "e2e-kubectl", "namespace": "ns-2"},
        "data": data,
    }
    path.write_text(json.dumps(doc))
    return path


def test_kubectl_create_label_apply_delete(stack: Stack, kubectl: Kubectl, tmp_path: Path) -> None:
    proxy, sim = stack.proxy.url, stack.sim.url
    upstream_path = "/api/v1/namespaces/ns-2/configmaps/e2e-kubectl"
    first = manifest(tmp_path / "cm.json", {"greeting": "hello"})

    out = kubectl.run(proxy, "create", "-f", str(first)).stdout
    assert "configmap/e2e-kubectl created" in out
    assert get_ok(sim, upstream_path)["data"] == {"greeting": "hello"}

    out = kubectl.run(proxy, "label", "configmap", "e2e-kubectl", "-n", "ns-2", "tier=e2e").stdout
    assert "configmap/e2e-kubectl labeled" in out
    assert get_ok(sim, upstream_path)["metadata"]["labels"] == {"tier": "e2e"}
    # Read back through the proxy: the label is there for GET and for a selector LIST.
    shown = json.loads(kubectl.run(proxy, "get", "configmap", "e2e-kubectl", "-n", "ns-2", "-o", "json").stdout)
    assert shown["metadata"]["labels"] == {"tier": "e2e"}
    selected = kubectl.run(proxy, "get", "configmaps", "-n", "ns-2", "-l", "tier=e2e", "-o", "name").stdout.split()
    assert selected == ["configmap/e2e-kubectl"]

    second = manifest(tmp_path / "cm2.json", {"greeting": "hi", "extra": "yes"})
    applied = kubectl.run(proxy, "apply", "--validate=false", "-f", str(second), check=False)
    if applied.returncode != 0:
        against_sim = kubectl.run(sim, "apply", "--validate=false", "-f", str(second), check=False)
        if against_sim.returncode != 0:
            pytest.skip(f"kubectl apply fails against the sim itself too: {against_sim.stderr.strip()}")
        pytest.fail(f"kubectl apply fails through the proxy but not against the sim:\n{applied.stderr}")
    assert "configmap/e2e-kubectl configured" in applied.stdout
    after = get_ok(sim, upstream_path)
    assert after["data"] == {"greeting": "hi", "extra": "yes"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in after["metadata"]["annotations"]
    again = kubectl.run(proxy, "apply", "--validate=false", "-f", str(second)).stdout
    assert "configmap/e2e-kubectl unchanged" in again

    out = kubectl.run(proxy, "delete", "configmap", "e2e-kubectl", "-n", "ns-2", "--wait=false").stdout
    assert 'configmap "e2e-kubectl" deleted' in out
    assert get(sim, upstream_path).status == 404
    gone = kubectl.run(proxy, "get", "configmap", "e2e-kubectl", "-n", "ns-2", check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr


# ---------------------------------------------------------------------------------------------- python client


@pytest.fixture
def v1(stack: Stack) -> Iterator[client.CoreV1Api]:
    config = client.Configuration()
    config.host = stack.proxy.url
    config.retries = 0
    with client.ApiClient(config) as api_client:
        yield client.CoreV1Api(api_client)


def test_python_client_paged_list_is_the_upstreams_state_at_one_rv(stack: Stack, v1: client.CoreV1Api) -> None:
    seen: Counter[str] = Counter()
    versions: dict[str, int] = {}
    list_rvs = set()
    token = None
    pages = 0
    while True:
        page = v1.list_pod_for_all_namespaces(limit=25, _continue=token, _request_timeout=TIMEOUT)
        pages += 1
        assert len(page.items) <= 25
        list_rvs.add(page.metadata.resource_version)
        for p in page.items:
            key = f"{p.metadata.namespace}/{p.metadata.name}"
            seen[key] += 1
            versions[key] = int(p.metadata.resource_version)
        token = page.metadata._continue
        if not token:
            break
        assert pages < 10, "paging does not end"
    assert pages == 5  # 120 pods, 25 a page
    assert len(list_rvs) == 1, list_rvs
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]
    r = list_rvs.pop()
    exact = get_ok(stack.sim.url, "/api/v1/pods", resourceVersion=r, resourceVersionMatch="Exact")
    assert versions == {key_of(i): rv_of(i) for i in exact["items"]}


def test_python_client_watch_receives_writes_made_through_the_proxy(v1: client.CoreV1Api, stack: Stack) -> None:
    ns = "ns-0"
    start = v1.list_namespaced_config_map(ns, _request_timeout=TIMEOUT).metadata.resource_version
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="e2e-py"), data={"k": "v1"})
    written = [v1.create_namespaced_config_map(ns, body, _request_timeout=TIMEOUT)]
    seen: list[tuple[str, str, int, Any]] = []
    w = watch.Watch()
    for event in w.stream(
        v1.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=TIMEOUT, _request_timeout=TIMEOUT
    ):
        obj = event["object"]
        seen.append((event["type"], obj.metadata.name, int(obj.metadata.resource_version), obj.data))
        if obj.metadata.name != "e2e-py":
            continue
        # Each write is made only once the previous one came back on the watch: live delivery, not replay.
        if event["type"] == "ADDED":
            patch = {"data": {"k": "v2"}}
            written.append(v1.patch_namespaced_config_map("e2e-py", ns, patch, _request_timeout=TIMEOUT))
        elif event["type"] == "MODIFIED":
            v1.delete_namespaced_config_map("e2e-py", ns, _request_timeout=TIMEOUT)
        elif event["type"] == "DELETED":
            w.stop()
    ours = [s for s in seen if s[1] == "e2e-py"]
    assert [s[0] for s in ours] == ["ADDED", "MODIFIED", "DELETED"], seen
    assert [s[2] for s in ours[:2]] == [int(o.metadata.resource_version) for o in written]
    assert ours[1][3] == {"k": "v2"}
    assert ours[2][2] > ours[1][2]
    assert get(stack.sim.url, f"/api/v1/namespaces/{ns}/configmaps/e2e-py").status == 404


def test_python_client_create_and_replace_through_the_proxy(v1: client.CoreV1Api, stack: Stack) -> None:
    """The client sends create and replace bodies without a Content-Type: the proxy must forward them so."""
    ns = "ns-1"
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="e2e-py-create"), data={"k": "v1"})
    created = v1.create_namespaced_config_map(ns, body, _request_timeout=TIMEOUT)
    assert get_ok(stack.sim.url, f"/api/v1/namespaces/{ns}/configmaps/e2e-py-create")["data"] == {"k": "v1"}
    created.data = {"k": "v2"}
    v1.replace_namespaced_config_map("e2e-py-create", ns, created, _request_timeout=TIMEOUT)
    assert get_ok(stack.sim.url, f"/api/v1/namespaces/{ns}/configmaps/e2e-py-create")["data"] == {"k": "v2"}
    v1.delete_namespaced_config_map("e2e-py-create", ns, _request_timeout=TIMEOUT)

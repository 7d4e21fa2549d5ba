"""pods/log: the simulated cluster answers as the real kube-apiserver v1.36 of ../shared/tools/kube-reference
does when a pod's kubelet cannot be reached (the kit has no kubelet): the same codes, no reason on the
500, the same ``Get "https://NODE:PORT/containerLogs/NS/POD/CONTAINER": ...`` form, the same 400s and 204.

Skipped, with the reason, when KUBE_REFERENCE_KUBECONFIG is unset (CI machines)."""

from __future__ import annotations

import json
import os
import random
import re
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Proc, start
from tests.support.httpkube import get, get_ok, request
from watchcache.sim.fixtures import make_node

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver (KUBE_REFERENCE_KUBECONFIG unset): see shared/tools/kube-reference/README.md",
)

SUFFIX = uuid.uuid4().hex[:6]
NAMESPACE = f"ops-docs-logs-{SUFFIX}"
NODE = f"ops-docs-node-{SUFFIX}"


def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    env = os.environ
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(env["KUBE_REFERENCE_URL"] + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {env['KUBE_REFERENCE_TOKEN']}")
    req.add_header("Content-Type", "application/json")
    ctx = ssl.create_default_context(cafile=env["KUBE_REFERENCE_CA"])
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def kube() -> Iterator[None]:
    # A Node like the sim's (its Hostname address, no kubelet behind it), a pod bound to it, one unbound.
    node = make_node(NODE, random.Random(1))
    node["status"]["addresses"] = [
        {"type": "InternalIP", "address": "127.0.0.1"},
        {"type": "Hostname", "address": NODE},
    ]
    assert call("POST", "/api/v1/nodes", node)[0] == 201
    call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # No controller manager on the reference: the ServiceAccount a pod needs is made by hand.
    call("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})
    containers = [{"name": "app", "image": "busybox"}, {"name": "sidecar", "image": "busybox"}]
    for name, node_name in (("bound", NODE), ("unbound", "")):
        # Unbound for good: a scheduler nobody runs (the kit's own scheduler would bind it with --control-plane).
        where = {"nodeName": node_name} if node_name else {"schedulerName": "watchcache-reference-none"}
        spec: dict[str, Any] = {"containers": containers, **where}
        assert (
            call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {"metadata": {"name": name}, "spec": spec})[0] == 201
        )
    try:
        yield
    finally:
        for name in ("bound", "unbound"):
            call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
        call("DELETE", f"/api/v1/nodes/{NODE}")
        call("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        # Without the namespace controller, the namespace's finalizer is lifted here.
        finalized = {"metadata": {"name": NAMESPACE}, "spec": {"finalizers": []}}
        call("PUT", f"/api/v1/namespaces/{NAMESPACE}/finalize", finalized)


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start("sim", "--objects", "3", "--namespaces", "1")
    yield proc
    proc.stop()


def test_the_sims_pods_log_answers_have_kubes_codes_and_form(kube: None, sim: Proc) -> None:
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    status, direct = call("GET", f"{pods}/bound/log?container=app")
    assert status == 500 and direct["code"] == 500 and "reason" not in direct, direct
    assert re.fullmatch(rf'Get "https://{NODE}:10250/containerLogs/{NAMESPACE}/bound/app": .+', direct["message"])

    pod = get_ok(sim.url, "/api/v1/namespaces/ns-0/pods")["items"][0]
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    container = pod["spec"]["containers"][0]["name"]
    answer = get(sim.url, f"/api/v1/namespaces/ns-0/pods/{name}/log", container=container)
    ours = answer.json()
    assert answer.status == 500 and ours["code"] == 500 and "reason" not in ours, ours
    assert re.fullmatch(rf'Get "https://{node}:10250/containerLogs/ns-0/{name}/{container}": .+', ours["message"])
    assert set(ours) == set(direct)  # kind, apiVersion, metadata, status, message, code

    # kube's container checks, before the node is even looked at: the same 400s.
    two = get_ok(sim.url, "/api/v1/namespaces/ns-0/pods")["items"]
    multi = next((p for p in two if len(p["spec"]["containers"]) > 1), None)
    status, direct = call("GET", f"{pods}/bound/log")
    assert (status, direct["message"]) == (
        400,
        "a container name must be specified for pod bound, choose one of: [app sidecar]",
    )
    if multi is not None:
        names = " ".join(c["name"] for c in multi["spec"]["containers"])
        answer = get(sim.url, f"/api/v1/namespaces/ns-0/pods/{multi['metadata']['name']}/log")
        assert (answer.status, answer.json()["message"]) == (
            400,
            f"a container name must be specified for pod {multi['metadata']['name']}, choose one of: [{names}]",
        )
    status, direct = call("GET", f"{pods}/bound/log?container=nope")
    answer = get(sim.url, f"/api/v1/namespaces/ns-0/pods/{name}/log", container="nope")
    assert (status, answer.status) == (400, 400)
    assert direct["message"] == "container nope is not valid for pod bound"
    assert answer.json()["message"] == f"container nope is not valid for pod {name}"


def test_an_unbound_pods_log_is_empty_as_kubes(kube: None, sim: Proc) -> None:
    assert call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/unbound/log?container=app") == (204, None)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound", "namespace": "ns-0"},
           "spec": {"containers": [{"name": "app", "image": "busybox"}]}}  # fmt: skip
    assert request(sim.url, "POST", "/api/v1/namespaces/ns-0/pods", pod).status == 201
    answer = get(sim.url, "/api/v1/namespaces/ns-0/pods/unbound/log", container="app")
    assert (answer.status, answer.body) == (204, b"")

"""pods/log of the simulated cluster: kube-apiserver's validation, then the answer of a cluster whose kubelets
cannot be reached (pod.LogLocation, then the failed dial as a Status with no reason)."""

from __future__ import annotations

import random

import pytest

from watchcache.apierrors import StatusError
from watchcache.sim.fixtures import make_node, make_pod
from watchcache.sim.podlogs import answer, kubelet_host


def pod(node: str = "node-1", containers: int = 1) -> dict:
    body = make_pod("web-1", "ns-0", node, random.Random(1), app="frontend")
    body["spec"]["containers"] = body["spec"]["containers"][:1] * containers
    for i, c in enumerate(body["spec"]["containers"]):
        body["spec"]["containers"][i] = {**c, "name": f"c{i}"}
    return body


def test_a_bound_pod_gets_a_500_naming_the_kubelet_kube_would_dial() -> None:
    node = make_node("node-1", random.Random(2))
    with pytest.raises(StatusError) as err:
        answer(pod(), None, node)
    assert (err.value.code, err.value.reason) == (500, "")
    assert err.value.message == (
        'Get "https://node-1:10250/containerLogs/ns-0/web-1/c0": '
        'the simulated cluster has no kubelets: node "node-1" serves no container logs'
    )


def test_kubes_container_checks_come_first() -> None:
    node = make_node("node-1", random.Random(2))
    with pytest.raises(StatusError) as err:
        answer(pod(containers=2), None, node)
    assert (err.value.code, err.value.message) == (
        400,
        "a container name must be specified for pod web-1, choose one of: [c0 c1]",
    )
    with pytest.raises(StatusError) as err:
        answer(pod(), "nope", node)
    assert (err.value.code, err.value.message) == (400, "container nope is not valid for pod web-1")


def test_an_unbound_pod_has_an_empty_log_and_a_missing_node_is_not_found() -> None:
    assert answer(pod(node=""), None, None) == 204
    with pytest.raises(StatusError) as err:
        answer(pod(node="gone"), None, None)
    assert (err.value.code, err.value.message) == (404, 'nodes "gone" not found')


def test_the_kubelet_address_follows_kubes_preferred_address_types_and_port() -> None:
    node = {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}}
    assert kubelet_host(node, "n") == "10.0.0.7:10250"
    node["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": 10251}}
    node["status"]["addresses"].append({"type": "Hostname", "address": "n.example"})
    assert kubelet_host(node, "n") == "n.example:10251"
    assert kubelet_host({"status": {"addresses": [{"type": "InternalIP", "address": "fd00::1"}]}}, "n") == (
        "[fd00::1]:10250"
    )
    assert kubelet_host(None, "n") == "n:10250"

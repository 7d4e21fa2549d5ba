"""Differential: API Priority and Fairness classification through watchcache against kube-apiserver v1.36.

The proxy follows the apiserver's own FlowSchemas and PriorityLevelConfigurations, so for the same
user and request its ``X-Kubernetes-PF-*`` headers name the same objects (their UIDs) as kube's.
Two ServiceAccounts (tokens from TokenRequest) are flows of kube's ``service-accounts`` schema;
the admin is exempt; an unauthenticated request is answered before classification by both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kube.kit import Api, KubeEnv, Serving, needs_kube, start_proxy, wait_for
from harness.processes import Proc

pytestmark = needs_kube

NAMESPACE = "apf-flowcontrol"  # this branch's namespace in the shared apiserver
FS = "x-kubernetes-pf-flowschema-uid"
PL = "x-kubernetes-pf-prioritylevel-uid"


@pytest.fixture(scope="module")
def kube() -> KubeEnv:
    return KubeEnv.from_environ()


@pytest.fixture(scope="module")
def setup(kube: KubeEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Proc, Serving, dict]]:
    admin = Api(kube.url, kube.token, kube.ca)
    if not admin.exists(f"/api/v1/namespaces/{NAMESPACE}"):
        admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    tokens = {}
    for name in ("noisy", "quiet"):
        path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
        if not admin.exists(f"{path}/{name}"):
            admin.create(path, {"metadata": {"name": name}})
        review = admin.create(
            f"{path}/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )
        tokens[name] = review["status"]["token"]
    binding = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"
    if not admin.exists(f"{binding}/view"):
        admin.create(binding, {
            "metadata": {"name": "view"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": n, "namespace": NAMESPACE} for n in tokens],
        })  # fmt: skip
    serving = Serving.make(Path(tmp_path_factory.mktemp("apf-pki")))
    proxy = start_proxy(kube, serving, "--workers", "1")
    probe = Api(proxy.url, kube.token, str(serving.ca.crt))
    wait_for(lambda: b"the upstream's" in probe.raw("GET", "/readyz?verbose")[2], 30, "the upstream's FlowSchemas")
    yield admin, proxy, serving, tokens
    proxy.stop()
    admin.close()


def test_pf_headers_match_kube_for_the_same_user_and_request(kube: KubeEnv, setup: tuple) -> None:
    admin, proxy, serving, tokens = setup
    fs_uid, pl_uid = (
        {o["metadata"]["name"]: o["metadata"]["uid"]
         for o in admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/{kind}")["items"]}
        for kind in ("flowschemas", "prioritylevelconfigurations")
    )  # fmt: skip
    cases = [
        (tokens["quiet"], f"/api/v1/namespaces/{NAMESPACE}/pods", 200, "service-accounts", "workload-low"),
        (tokens["noisy"], f"/api/v1/namespaces/{NAMESPACE}/configmaps", 200, "service-accounts", "workload-low"),
        (tokens["quiet"], "/api/v1/nodes", 403, "service-accounts", "workload-low"),
        (tokens["quiet"], f"/api/v1/namespaces/{NAMESPACE}/secrets", 403, "service-accounts", "workload-low"),
        (kube.token, f"/api/v1/namespaces/{NAMESPACE}/pods", 200, "exempt", "exempt"),
        (kube.nobody_token, "/api/v1/pods", 403, "global-default", "global-default"),
        ("not-a-token", "/api/v1/pods", 401, None, None),
    ]
    for token, path, code, schema, level in cases:
        direct = Api(kube.url, token, kube.ca).raw("GET", path)
        proxied = Api(proxy.url, token, str(serving.ca.crt)).raw("GET", path)
        assert (direct[0], proxied[0]) == (code, code), (path, direct[0], proxied[0], proxied[2][:200])
        if schema is None:
            assert FS not in direct[1] and FS not in proxied[1], (path, direct[1], proxied[1])
            continue
        assert (direct[1][FS], direct[1][PL]) == (fs_uid[schema], pl_uid[level]), (path, direct[1])
        assert (proxied[1][FS], proxied[1][PL]) == (direct[1][FS], direct[1][PL]), (path, proxied[1])


def test_a_flow_schema_created_in_kube_applies_through_the_proxy_live(kube: KubeEnv, setup: tuple) -> None:
    """The proxy watches kube's FlowSchemas: one created for the quiet ServiceAccount classifies its next
    request through the proxy as kube does, and its deletion too, each within a watch event's delay."""
    admin, proxy, serving, tokens = setup
    path = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"
    name = "apf2-quiet-first"
    if admin.exists(f"{path}/{name}"):
        admin.raw("DELETE", f"{path}/{name}")
    user = f"system:serviceaccount:{NAMESPACE}:quiet"
    created = admin.create(path, {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
        "spec": {"matchingPrecedence": 500, "priorityLevelConfiguration": {"name": "workload-high"},
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "User", "user": {"name": user}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "namespaces": ["*"], "clusterScope": True}]}]},
    })  # fmt: skip
    uid = created["metadata"]["uid"]
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    proxied = Api(proxy.url, tokens["quiet"], str(serving.ca.crt))
    try:
        wait_for(lambda: proxied.raw("GET", pods)[1].get(FS) == uid, 10, "the proxy classifying by the new schema")
        assert Api(kube.url, tokens["quiet"], kube.ca).raw("GET", pods)[1][FS] == uid
    finally:
        admin.raw("DELETE", f"{path}/{name}")
    wait_for(lambda: proxied.raw("GET", pods)[1].get(FS) != uid, 10, "the proxy forgetting the deleted schema")
    assert proxied.raw("GET", pods)[1][FS] == Api(kube.url, tokens["quiet"], kube.ca).raw("GET", pods)[1][FS]

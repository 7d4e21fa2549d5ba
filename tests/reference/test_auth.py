"""Differential: identity and authorization through watchcache against a real kube-apiserver v1.36.

The same request sent to the apiserver directly and through watchcache (serving TLS, with the
apiserver's client CA as ``--client-ca-file``), answers compared: who the apiserver says the
caller is (SelfSubjectReview), what it refuses and how it words it. Runs only on a machine with
the reference control plane (``eval "$(shared/tools/kube-reference/env.sh)"``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.kube.kit import KubeEnv
from harness.pki import Pair, Pki
from harness.processes import Proc, start
from tests.support.tlsclient import SSR, SSR_PATH, call, wait_ready_tls

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver: see shared/tools/kube-reference/README.md",
)

NAMESPACE = "identity"  # this branch's namespace in the shared apiserver
_VARS = ("URL", "CA", "TOKEN", "NOBODY_TOKEN", "CLIENT_CERT", "CLIENT_KEY", "FRONT_PROXY_CERT", "FRONT_PROXY_KEY")


@dataclass
class Url:
    url: str


@dataclass
class Kube:
    """The reference apiserver and the identities of shared/tools/kube-reference."""

    api: Url
    ca: Pair
    admin: str
    nobody: str
    cert_user: Pair
    front_proxy: Pair

    def admin_call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return call(self.api, self.ca, method, path, body, token=self.admin)


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    env = {v: os.environ.get(f"KUBE_REFERENCE_{v}", "") for v in _VARS}
    missing = [f"KUBE_REFERENCE_{k}" for k, v in env.items() if not v]
    if missing:
        pytest.skip(f'{", ".join(missing)} unset: eval "$(shared/tools/kube-reference/env.sh)"')
    api = Url(env["URL"])
    k = Kube(
        api,
        Pair(Path(env["CA"]), Path()),
        env["TOKEN"],
        env["NOBODY_TOKEN"],
        Pair(Path(env["CLIENT_CERT"]), Path(env["CLIENT_KEY"])),
        Pair(Path(env["FRONT_PROXY_CERT"]), Path(env["FRONT_PROXY_KEY"])),
    )
    # The namespace stays (without a controller manager a deleted namespace never finishes
    # terminating); what the tests create in it is deleted before and after.
    if k.admin_call("GET", f"/api/v1/namespaces/{NAMESPACE}")[0] == 404:
        status, body = k.admin_call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        assert status == 201, body
    cleanup(k)
    yield k
    cleanup(k)


CREATED = [
    f"/api/v1/namespaces/{NAMESPACE}/configmaps/by-cert",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/cm-writer",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings/cert-group-writes",
]


def cleanup(k: Kube) -> None:
    for path in CREATED:
        status, body = k.admin_call("DELETE", path)
        assert status in (200, 404), body


@dataclass
class Proxy:
    proc: Proc
    ca: Pair


def proxy(k: Kube, tmp: Path, *args: str, resources: str = "configmaps") -> Proxy:
    """watchcache in front of the apiserver, with its own serving certificate; the proxy's identity is admin."""
    pki = Pki(tmp)
    ca = pki.ca("serving-ca", "/CN=watchcache-test-serving-ca")
    server = pki.issue(ca, "server", "/CN=127.0.0.1", ip_san="127.0.0.1")
    token = tmp / "token"
    token.write_text(k.admin)
    proc = start(
        "serve", "--upstream", k.api.url, "--certificate-authority", str(k.ca.crt), "--token-file", str(token),
        "--workers", "1", "--resources", resources,
        "--tls-cert-file", str(server.crt), "--tls-private-key-file", str(server.key),
        "--client-ca-file", str(k.ca.crt), *args,
    )  # fmt: skip
    wait_ready_tls(proc, ca)
    return Proxy(proc, ca)


@pytest.fixture(scope="module")
def front_proxy(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    p = proxy(kube, tmp_path_factory.mktemp("fp"), "--proxy-client-cert-file", str(kube.front_proxy.crt),
              "--proxy-client-key-file", str(kube.front_proxy.key), "--no-anonymous-auth")  # fmt: skip
    yield p
    p.proc.stop()


def both(kube: Kube, p: Proxy, method: str, path: str, body: dict | None = None, **kw) -> tuple:
    """(direct answer, answer through the proxy)."""
    return call(kube.api, kube.ca, method, path, body, **kw), call(p.proc, p.ca, method, path, body, **kw)


def user_info(answer: tuple[int, dict]) -> dict:
    status, body = answer
    assert status == 201, body
    info: dict = body["status"]["userInfo"]
    return info


def test_a_certificate_user_is_itself_at_the_apiserver(kube: Kube, front_proxy: Proxy) -> None:
    direct, through = both(kube, front_proxy, "POST", SSR_PATH, SSR, cert=kube.cert_user)
    assert user_info(through) == user_info(direct)
    assert user_info(through)["username"] == "cert-user"
    assert user_info(through)["groups"] == ["cert-group", "system:authenticated"]
    assert "front-proxy identity headers: user ['X-Remote-User']" in "".join(front_proxy.proc.log)


def test_a_certificate_users_create_is_refused_then_allowed_once_granted(kube: Kube, front_proxy: Proxy) -> None:
    cm_path = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    direct, through = both(kube, front_proxy, "POST", cm_path, {"metadata": {"name": "x"}}, cert=kube.cert_user)
    assert through == direct
    assert through[0] == 403 and 'User "cert-user" cannot create resource "configmaps"' in through[1]["message"]
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
    role = {"metadata": {"name": "cm-writer"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                                           "verbs": ["create", "get"]}]}  # fmt: skip
    binding = {
        "metadata": {"name": "cert-group-writes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "cert-group"}],
    }
    assert kube.admin_call("POST", f"{rbac}/roles", role)[0] == 201
    assert kube.admin_call("POST", f"{rbac}/rolebindings", binding)[0] == 201
    deadline = time.monotonic() + 10  # RBAC reaches the authorizer through its informers
    while True:
        status, body = call(front_proxy.proc, front_proxy.ca, "POST", cm_path, {"metadata": {"name": "by-cert"}},
                            cert=kube.cert_user)  # fmt: skip
        if status != 403 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 201, body
    assert body["metadata"]["name"] == "by-cert"


def test_identity_headers_from_the_client_are_not_believed(kube: Kube, front_proxy: Proxy) -> None:
    spoof = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters"), ("X-Remote-Extra-Scopes", "all")]
    through = call(front_proxy.proc, front_proxy.ca, "POST", SSR_PATH, SSR, cert=kube.cert_user, headers=spoof)
    direct = call(kube.api, kube.ca, "POST", SSR_PATH, SSR, cert=kube.cert_user)
    assert user_info(through) == user_info(direct)
    through = call(front_proxy.proc, front_proxy.ca, "POST", SSR_PATH, SSR, token=kube.nobody, headers=spoof)
    assert user_info(through)["username"] == "nobody"


def test_bearer_tokens_pass_through_as_given(kube: Kube, front_proxy: Proxy) -> None:
    direct, through = both(kube, front_proxy, "POST", SSR_PATH, SSR, token=kube.nobody)
    assert user_info(through) == user_info(direct)
    direct, through = both(kube, front_proxy, "POST", SSR_PATH, SSR)  # no credentials: 401 at the apiserver
    assert through == direct and through[0] == 401


def test_client_impersonation_is_authorized_against_the_certificate_user(kube: Kube, front_proxy: Proxy) -> None:
    headers = [("Impersonate-User", "admin")]
    direct, through = both(kube, front_proxy, "POST", SSR_PATH, SSR, cert=kube.cert_user, headers=headers)
    assert through == direct
    assert through[0] == 403 and 'User "cert-user" cannot impersonate' in through[1]["message"]


@pytest.mark.parametrize("path", ["/metrics"])
def test_an_unauthorized_scrape_is_answered_as_the_apiserver_answers(kube: Kube, front_proxy: Proxy, path: str) -> None:
    direct, through = both(kube, front_proxy, "GET", path, token=kube.nobody)
    assert through == direct
    assert through == (403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                             "message": 'forbidden: User "nobody" cannot get path "/metrics"',
                             "reason": "Forbidden", "details": {}, "code": 403})  # fmt: skip
    direct, through = both(kube, front_proxy, "GET", path)  # anonymous-auth=false on both
    assert through == direct and through[0] == 401
    assert call(front_proxy.proc, front_proxy.ca, "GET", path, token=kube.admin)[0] == 200


def test_without_a_front_proxy_certificate_certificate_users_are_refused(kube: Kube, tmp_path: Path) -> None:
    p = proxy(kube, tmp_path)
    try:
        status, body = call(p.proc, p.ca, "POST", SSR_PATH, SSR, cert=kube.cert_user)
        assert status == 403 and "--proxy-client-cert-file" in body["message"]
        assert user_info(call(p.proc, p.ca, "POST", SSR_PATH, SSR, token=kube.nobody))["username"] == "nobody"
    finally:
        p.proc.stop()


def test_impersonate_mode_with_the_proxys_identity(kube: Kube, tmp_path: Path) -> None:
    p = proxy(kube, tmp_path, "--client-cert-passthrough", "impersonate")
    try:
        info = user_info(call(p.proc, p.ca, "POST", SSR_PATH, SSR, cert=kube.cert_user))
        assert info == {"username": "cert-user", "groups": ["cert-group", "system:authenticated"]}
    finally:
        p.proc.stop()


def test_over_plain_http_a_refused_pass_through_says_why(kube: Kube, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(kube.admin)
    proc = start("serve", "--upstream", kube.api.url, "--certificate-authority", str(kube.ca.crt),
                 "--token-file", str(token), "--workers", "1", "--resources", "configmaps")  # fmt: skip
    try:
        assert any("SERVING PLAIN HTTP" in line for line in proc.log)
        from tests.support.httpkube import call as http_call

        direct = call(kube.api, kube.ca, "GET", "/api")
        status, body = http_call(proc.url, "/api", None)
        assert direct[0] == status == 401 and direct[1]["reason"] == body["reason"] == "Unauthorized"
        assert body["message"].startswith("Unauthorized: this request reached watchcache over plain HTTP")
        assert http_call(proc.url, "/api", kube.nobody)[0] == 200  # a token sent explicitly still works
    finally:
        proc.stop()


def test_refused_reads_build_no_follower_replica(kube: Kube, tmp_path: Path) -> None:
    from tests.support.httpkube import call as http_call
    from tests.support.httpkube import shard_views

    token = tmp_path / "token"
    token.write_text(kube.admin)
    proc = start("serve", "--upstream", kube.api.url, "--certificate-authority", str(kube.ca.crt),
                 "--token-file", str(token), "--workers", "2",
                 "--resources", "configmaps,services,serviceaccounts")  # fmt: skip
    try:
        assert all(v["following"] == [] for v in shard_views(proc.url, kube.admin).values())
        for who, expected in ((kube.nobody, 403), (None, 403), ("not-a-token", 401)):
            for path in ("/api/v1/configmaps", "/api/v1/services?watch=1", "/api/v1/serviceaccounts"):
                for _ in range(8):
                    assert http_call(proc.url, path, who)[0] == expected, (who, path)
        assert {w: v["following"] for w, v in shard_views(proc.url, kube.admin).items()} == {0: [], 1: []}
        status, body = http_call(proc.url, "/debug/shards", kube.nobody)  # and the shard map is not public
        assert status == 403 and body["message"] == 'forbidden: User "nobody" cannot get path "/debug/shards"'
    finally:
        proc.stop()


def test_a_kind_never_cached_here_is_authorized_by_the_upstream_alone(kube: Kube, tmp_path: Path) -> None:
    """``--cache-exclude``: its reads go upstream before any review of the proxy's (server/decision.py), so a
    refused client gets kube's own 403, an allowed one kube's answer, and the proxy decided nothing."""
    p = proxy(kube, tmp_path, "--cache-exclude", "serviceaccounts")
    try:
        path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
        direct, through = both(kube, p, "GET", path, token=kube.nobody)
        assert direct[0] == through[0] == 403
        assert through[1] == direct[1]
        direct, through = both(kube, p, "GET", path, token=kube.admin)
        assert direct[0] == through[0] == 200
        assert {i["metadata"]["name"] for i in through[1]["items"]} == {
            i["metadata"]["name"] for i in direct[1]["items"]
        }
        status, metrics = call(p.proc, p.ca, "GET", "/metrics", token=kube.admin)
        assert status == 200
        denied = [line for line in metrics["text"].splitlines() if 'decision="denied"' in line]
        assert denied and float(denied[0].split()[-1]) == 0.0, denied  # the 403 was kube's, not a review here
        status, cache = call(p.proc, p.ca, "GET", "/debug/cache", token=kube.admin)
        assert status == 200 and cache["passed_through"].get("uncached-resource", 0) >= 2, cache["passed_through"]
    finally:
        p.proc.stop()


NODE = "wc-authz-node"
NODE_POD = f"/api/v1/namespaces/{NAMESPACE}/pods/on-{NODE}"


@pytest.fixture(scope="module")
def pods_proxy(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """A proxy that caches pods, so that a node's pod reads are served (and authorized) by it."""
    p = proxy(kube, tmp_path_factory.mktemp("pods"), "--proxy-client-cert-file", str(kube.front_proxy.crt),
              "--proxy-client-key-file", str(kube.front_proxy.key), resources="pods")  # fmt: skip
    yield p
    p.proc.stop()


def test_a_node_reads_its_own_pods_from_the_cache_as_kubes_node_authorizer_allows(
    kube: Kube, pods_proxy: Proxy, tmp_path: Path
) -> None:
    """kube v1.32+ (KEP-4601) lets a node list and watch pods only with ``spec.nodeName=<itself>``; the
    proxy's SubjectAccessReview must carry that selector, or a kubelet's pod watch gets 403."""
    node = KubeEnv.from_environ().issue_client_cert(tmp_path, "node", f"/CN=system:node:{NODE}/O=system:nodes")
    sa = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
    if kube.admin_call("GET", f"{sa}/default")[0] == 404:  # the kit runs no controller manager
        assert kube.admin_call("POST", sa, {"metadata": {"name": "default"}})[0] == 201
    pod = {
        "metadata": {"name": NODE_POD.rsplit("/", 1)[1]},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    status, body = kube.admin_call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert status == 201, body
    try:
        own = f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"
        deadline = time.monotonic() + 10
        while True:  # the proxy's cache gets the pod from its watch
            direct, through = both(kube, pods_proxy, "GET", own, cert=node)
            assert direct[0] == 200 and through[0] == 200, (direct, through)
            if [i["metadata"]["name"] for i in through[1]["items"]] == [pod["metadata"]["name"]] or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.1)
        names = [i["metadata"]["name"] for i in through[1]["items"]]
        assert names == [i["metadata"]["name"] for i in direct[1]["items"]] == [pod["metadata"]["name"]]
        watched = call(pods_proxy.proc, pods_proxy.ca, "GET", f"{own}&watch=1&timeoutSeconds=1", cert=node)
        # one ADDED event (decoded as the body's one JSON document), then the end at timeoutSeconds
        assert watched[0] == 200 and watched[1]["type"] == "ADDED", watched
        assert watched[1]["object"]["metadata"]["name"] == pod["metadata"]["name"]
        # every pod, or another node's: refused by both, in the same words
        for path in ("/api/v1/pods", "/api/v1/pods?fieldSelector=spec.nodeName%3Danother-node"):
            direct, through = both(kube, pods_proxy, "GET", path, cert=node)
            assert direct[0] == through[0] == 403, (path, direct, through)
            assert through[1]["message"] == direct[1]["message"]
    finally:
        kube.admin_call("DELETE", f"{NODE_POD}?gracePeriodSeconds=0")

"""Pass-through requests reach the upstream as their client, never as anyone else.

Real processes over TLS (kubectl and client-go send no credentials to an http:// server): the
simulated cluster as the upstream, serving HTTPS, believing a front proxy's ``X-Remote-*``
headers over a certificate from its request-header CA (as kube-apiserver with
``--requestheader-client-ca-file``), resolving ``Impersonate-*`` like kube; watchcache in
front of it with ``--client-ca-file`` and, per test, a front-proxy certificate, impersonation,
or neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness.pki import Pair, Pki
from harness.processes import Proc, start
from tests.support.tlsclient import SSR, SSR_PATH, call, wait_ready_tls

ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"

# The example policy, plus: the group "writers" may read and create configmaps in ns-1 and
# impersonate alice; the proxy's own identity may impersonate any user and group.
EXTRA_BINDINGS = [
    {
        "name": "writers",
        "groups": ["writers"],
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create"],
             "namespaces": ["ns-1"]},
            {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["alice"]},
        ],
    },
    {
        "name": "watchcache-impersonates",
        "users": ["system:serviceaccount:watchcache:watchcache"],
        "rules": [{"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]}],
    },
]  # fmt: skip


@dataclass
class Env:
    pki: Pki
    ca: Pair
    server: Pair
    front_proxy: Pair
    certs: dict[str, Pair]
    token_file: Path
    sim: Proc

    def proxy(self, *args: str) -> Proc:
        proc = start(
            "serve", "--upstream", self.sim.url, "--certificate-authority", str(self.ca.crt),
            "--token-file", str(self.token_file), "--workers", "1", "--resources", "pods,configmaps",
            "--tls-cert-file", str(self.server.crt), "--tls-private-key-file", str(self.server.key),
            "--client-ca-file", str(self.ca.crt), *args,
        )  # fmt: skip
        wait_ready_tls(proc, self.ca)
        return proc


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("identity")
    pki = Pki(root)
    ca = pki.ca("ca", "/CN=test-ca")
    front_proxy_ca = pki.ca("front-proxy-ca", "/CN=test-front-proxy-ca")
    certs = {
        "cert-user": pki.issue(ca, "cert-user", "/CN=cert-user/O=cert-group"),
        "cert-writer": pki.issue(ca, "cert-writer", "/CN=cert-writer/O=writers"),
        # Signed by the request-header CA, but not a CN the upstream allows.
        "rogue-front-proxy": pki.issue(front_proxy_ca, "rogue", "/CN=rogue-proxy"),
    }
    policy = yaml.safe_load((ROOT / "watchcache/sim/policy-example.yaml").read_text())
    policy["bindings"] += EXTRA_BINDINGS
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    token_file = root / "token"
    token_file.write_text("watchcache-token")
    server = pki.issue(ca, "server", "/CN=127.0.0.1", ip_san="127.0.0.1")
    sim = start(
        "sim", "--objects", "10", "--namespaces", "2", "--policy-file", str(root / "policy.yaml"),
        "--tls-cert-file", str(server.crt), "--tls-private-key-file", str(server.key),
        "--client-ca-file", str(ca.crt),
        "--requestheader-client-ca-file", str(front_proxy_ca.crt),
        "--requestheader-allowed-names", "front-proxy-client",
    )  # fmt: skip
    try:
        front_proxy = pki.issue(front_proxy_ca, "front-proxy-client", "/CN=front-proxy-client")
        yield Env(pki, ca, server, front_proxy, certs, token_file, sim)
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def front_proxy(env: Env) -> Iterator[Proc]:
    proc = env.proxy("--proxy-client-cert-file", str(env.front_proxy.crt), "--proxy-client-key-file",
                     str(env.front_proxy.key))  # fmt: skip
    yield proc
    proc.stop()


def whoami(proc: Proc, env: Env, *, who: str | None = None, token: str | None = None, **kw) -> tuple[int, dict]:
    status, body = call(proc, env.ca, "POST", SSR_PATH, SSR, cert=env.certs[who] if who else None, token=token, **kw)
    return status, body.get("status", {}).get("userInfo", body) if status == 201 else body


# --- front-proxy ---------------------------------------------------------------------------------


def test_a_certificate_user_reaches_the_upstream_as_itself(env: Env, front_proxy: Proc) -> None:
    direct = whoami(env.sim, env, who="cert-user")
    through = whoami(front_proxy, env, who="cert-user")
    assert direct[0] == through[0] == 201
    assert through[1] == direct[1]
    assert through[1]["username"] == "cert-user"
    assert through[1]["groups"] == ["cert-group", "system:authenticated"]
    assert through[1]["extra"][CREDENTIAL_ID][0].startswith("X509SHA256=")


def test_a_certificate_users_write_is_authorized_for_that_user(env: Env, front_proxy: Proc) -> None:
    cm = {"metadata": {"name": "from-cert"}, "data": {"a": "b"}}
    status, body = call(front_proxy, env.ca, "POST", "/api/v1/namespaces/ns-1/configmaps", cm,
                        cert=env.certs["cert-user"])  # fmt: skip
    assert (status, body["message"]) == (
        403,
        'configmaps is forbidden: User "cert-user" cannot create resource "configmaps" in API group "" '
        'in the namespace "ns-1"',
    )
    status, body = call(front_proxy, env.ca, "POST", "/api/v1/namespaces/ns-1/configmaps", cm,
                        cert=env.certs["cert-writer"])  # fmt: skip
    assert status == 201, body
    # And the cached read of what it wrote: authorized for the certificate user by the gate.
    status, body = call(front_proxy, env.ca, "GET", "/api/v1/namespaces/ns-1/configmaps/from-cert?resourceVersion=0",
                        cert=env.certs["cert-writer"])  # fmt: skip
    assert status == 200 and body["data"] == {"a": "b"}


SPOOFED = [
    ("X-Remote-User", "admin"),
    ("X-Remote-Group", "system:masters"),
    ("X-Remote-Extra-Scopes", "everything"),
    ("X-Remote-Uid", "uid-admin"),
    ("x-remote-group", "writers"),
]


def test_identity_headers_from_clients_never_reach_the_upstream(env: Env, front_proxy: Proc) -> None:
    status, user = whoami(front_proxy, env, who="cert-user", headers=SPOOFED)
    assert status == 201 and user == whoami(env.sim, env, who="cert-user")[1]
    cm = {"metadata": {"name": "spoofed"}}
    status, _ = call(front_proxy, env.ca, "POST", "/api/v1/namespaces/ns-1/configmaps", cm,
                     cert=env.certs["cert-user"], headers=SPOOFED)  # fmt: skip
    assert status == 403
    # Token clients and anonymous ones too (their connection carries no front-proxy certificate,
    # but the headers are dropped all the same).
    assert whoami(front_proxy, env, token="alice-token", headers=SPOOFED)[1]["username"] == "alice"
    assert whoami(front_proxy, env, headers=SPOOFED)[1]["username"] == "system:anonymous"


def test_bearer_tokens_pass_through_as_given(env: Env, front_proxy: Proc) -> None:
    status, user = whoami(front_proxy, env, token="alice-token")
    assert status == 201 and user == {"username": "alice", "uid": "uid-alice", "groups": ["system:authenticated"]}
    assert whoami(front_proxy, env)[1] == {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
    assert whoami(front_proxy, env, token="not-a-token")[0] == 401


def test_client_impersonation_is_authorized_against_the_certificate_user(env: Env, front_proxy: Proc) -> None:
    status, body = whoami(front_proxy, env, who="cert-user", headers=[("Impersonate-User", "alice")])
    assert (status, body["message"]) == (
        403,
        'users "alice" is forbidden: User "cert-user" cannot impersonate resource "users" in API group "" '
        "at the cluster scope",
    )
    status, user = whoami(front_proxy, env, who="cert-writer", headers=[("Impersonate-User", "alice")])
    assert status == 201 and user == {"username": "alice", "groups": ["system:authenticated"]}


def test_the_upstream_believes_only_an_allowed_front_proxy_certificate(env: Env) -> None:
    # What the proxy relies on, checked on the upstream itself.
    spoof = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")]
    for who in ("rogue-front-proxy", "cert-user"):
        status, user = whoami(env.sim, env, who=who, headers=spoof)
        assert status == 201 and user["username"] != "admin", who
    status, user = call(env.sim, env.ca, "POST", SSR_PATH, SSR, cert=env.front_proxy, headers=spoof)
    assert status == 201 and user["status"]["userInfo"]["username"] == "admin"


# --- without a way to present certificate users --------------------------------------------------


def test_without_a_front_proxy_certificate_certificate_users_are_refused(env: Env) -> None:
    proxy = env.proxy()
    try:
        status, body = whoami(proxy, env, who="cert-user")
        assert status == 403 and body["reason"] == "Forbidden" and body["details"] == {}
        assert body["message"].startswith('forbidden: User "cert-user" (authenticated by a client certificate) cannot')
        assert "--proxy-client-cert-file" in body["message"] and "--client-cert-passthrough" in body["message"]
        # Their cached reads still work (the gate authorizes them), and token users are untouched.
        status, _ = call(proxy, env.ca, "GET", "/api/v1/namespaces/ns-1/configmaps?resourceVersion=0",
                         cert=env.certs["cert-writer"])  # fmt: skip
        assert status == 200
        assert whoami(proxy, env, token="alice-token")[1]["username"] == "alice"
    finally:
        proxy.stop()


# --- impersonation by the proxy's own identity ---------------------------------------------------


def test_impersonate_mode_presents_certificate_users_with_the_proxys_identity(env: Env) -> None:
    proxy = env.proxy("--client-cert-passthrough", "impersonate")
    try:
        status, user = whoami(proxy, env, who="cert-user")
        assert status == 201 and user == {"username": "cert-user", "groups": ["cert-group", "system:authenticated"]}
        cm = {"metadata": {"name": "by-impersonation"}}
        status, body = call(proxy, env.ca, "POST", "/api/v1/namespaces/ns-1/configmaps", cm,
                            cert=env.certs["cert-user"])  # fmt: skip
        assert status == 403 and 'User "cert-user" cannot create' in body["message"]
        status, _ = call(proxy, env.ca, "POST", "/api/v1/namespaces/ns-1/configmaps", cm,
                         cert=env.certs["cert-writer"], headers=SPOOFED)  # fmt: skip
        assert status == 201
        # The client's own impersonation cannot be nested under the proxy's: refused, never dropped.
        status, body = whoami(proxy, env, who="cert-writer", headers=[("Impersonate-User", "alice")])
        assert status == 403 and "does not nest" in body["message"]
        assert whoami(proxy, env, token="alice-token")[1]["username"] == "alice"
    finally:
        proxy.stop()


# --- plain HTTP: nothing that passes through has credentials -------------------------------------


def test_over_plain_http_a_credential_less_pass_through_says_why_it_is_refused(env: Env) -> None:
    from tests.support.httpkube import call as http_call

    sim = start("sim", "--objects", "5", "--policy-file", str(env.token_file.parent / "policy.yaml"),
                "--no-anonymous-auth")  # fmt: skip
    try:
        proxy = start("serve", "--upstream", sim.url, "--token-file", str(env.token_file), "--authentication",
                      "delegated", "--workers", "1", "--resources", "pods")  # fmt: skip
        try:
            assert any("SERVING PLAIN HTTP" in line and "send no bearer token" in line for line in proxy.log)
            for method, path, body in (("GET", "/api", None), ("POST", "/api/v1/namespaces/ns-0/configmaps", {})):
                status, answer = http_call(proxy.url, path, None, method, body)
                assert (status, answer["reason"]) == (401, "Unauthorized"), answer
                assert answer["message"].startswith("Unauthorized: this request reached watchcache over plain HTTP")
                assert "https://" in answer["message"]
            # With a token the upstream's own answer goes back untouched.
            status, answer = http_call(proxy.url, "/api/v1/namespaces/ns-0/configmaps", "alice-token", "POST", {})
            assert status == 403 and answer["message"].startswith("configmaps is forbidden")
        finally:
            proxy.stop()
    finally:
        sim.stop()


def test_over_tls_there_is_no_plain_http_warning(env: Env, front_proxy: Proc) -> None:
    assert not any("SERVING PLAIN HTTP" in line for line in front_proxy.log)


def test_routes_are_counted(env: Env, front_proxy: Proc) -> None:
    whoami(front_proxy, env, who="cert-user")
    whoami(front_proxy, env, token="alice-token")
    status, body = call(front_proxy, env.ca, "GET", "/metrics", token="admin-token")
    assert status == 200
    text = body["text"]
    for route in ("client", "front-proxy"):
        line = next(
            x for x in text.splitlines() if x.startswith(f'watchcache_passthrough_identity_total{{route="{route}"')
        )
        assert float(line.rsplit(" ", 1)[1]) >= 1, line
    assert 'watchcache_passthrough_identity_total{route="refused"} 0.0' in text

"""Pass-through keeps the client's header lines, against the real kube-apiserver (when
KUBE_REFERENCE_KUBECONFIG is set): ``kubectl --as x --as-group a --as-group b`` through the
proxy must reach kube as two groups, as it does without the proxy.

The same against a local echo upstream (always runs): tests/e2e/test_passthrough_headers.py.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.pki import make_pki
from harness.processes import Proc, start

needs_kube = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver (KUBE_REFERENCE_KUBECONFIG unset): see shared/tools/kube-reference/README.md",
)

REVIEW = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
REVIEW_PATH = b"/apis/authentication.k8s.io/v1/selfsubjectreviews"


def _port(proc: Proc) -> int:
    return int(proc.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def kube_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, dict[str, Path]]]:
    """The proxy over TLS (kubectl sends no token to http://) in front of the reference apiserver."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    proxy = start(
        "serve", "--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"], "--resources", "configmaps",
        "--workers", "1", "--tls-cert-file", str(pki["srv.crt"]), "--tls-private-key-file", str(pki["srv.key"]),
    )  # fmt: skip
    yield proxy, pki
    proxy.stop()


def _groups(review: dict) -> list[str]:
    return review["status"]["userInfo"]["groups"]


@needs_kube
def test_raw_impersonate_group_lines_reach_kube_as_two_groups(kube_proxy: tuple[Proc, dict[str, Path]]) -> None:
    proxy, pki = kube_proxy
    ctx = ssl.create_default_context(cafile=str(pki["ca.crt"]))
    conn = http.client.HTTPSConnection("127.0.0.1", _port(proxy), context=ctx, timeout=10)
    conn.putrequest("POST", REVIEW_PATH.decode())
    for name, value in (
        ("Authorization", f"Bearer {os.environ['KUBE_REFERENCE_TOKEN']}"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(REVIEW))),
        ("Impersonate-User", "x"),
        ("Impersonate-Group", "a"),
        ("Impersonate-Group", "b"),
        ("Impersonate-Extra-Scopes", "s1"),
        ("Impersonate-Extra-Scopes", "s2"),
    ):
        conn.putheader(name, value)
    conn.endheaders(REVIEW)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 201, body[:500]
    review = json.loads(body)
    assert review["status"]["userInfo"]["username"] == "x"
    assert _groups(review) == ["a", "b", "system:authenticated"]
    assert review["status"]["userInfo"]["extra"] == {"scopes": ["s1", "s2"]}


@needs_kube
def test_kubectl_as_group_twice_through_the_proxy(kube_proxy: tuple[Proc, dict[str, Path]], tmp_path: Path) -> None:
    proxy, pki = kube_proxy
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "proxy", "cluster": {"server": proxy.url, "certificate-authority": str(pki["ca.crt"])}}
                ],
                "users": [{"name": "admin", "user": {"token": os.environ["KUBE_REFERENCE_TOKEN"]}}],
                "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "admin"}}],
                "current-context": "proxy",
            }
        )
    )
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json",
         "--as", "x", "--as-group", "a", "--as-group", "b"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    review = json.loads(out.stdout)
    assert review["status"]["userInfo"]["username"] == "x"
    assert _groups(review) == ["a", "b", "system:authenticated"]


DISCOVERY_ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _cache_control(host: str, port: int, ctx: ssl.SSLContext, path: str, **headers: str) -> tuple[int, list, str]:
    """(status, the Cache-Control lines, the ETag) of one GET as the admin."""
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {os.environ['KUBE_REFERENCE_TOKEN']}", **headers})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, resp.headers.get_all("Cache-Control") or [], resp.headers.get("ETag", "")


def _revalidated(host: str, port: int, ctx: ssl.SSLContext, path: str, accept: str) -> tuple[int, list, str]:
    """A revalidation's answer: the ETag fetched, then sent back (again, if a CRD another test made or
    removed changed the discovery document in between)."""
    for _ in range(5):
        etag = _cache_control(host, port, ctx, path, Accept=accept)[2]
        answer = _cache_control(host, port, ctx, path, Accept=accept, **{"If-None-Match": etag})
        if answer[0] == 304:
            break
    return answer


@needs_kube
@pytest.mark.parametrize(
    "path,accept",
    [("/api", DISCOVERY_ACCEPT), ("/apis", DISCOVERY_ACCEPT), ("/api/v1/namespaces/default", "application/json")],
)
def test_cache_control_through_the_proxy_is_kubes(
    kube_proxy: tuple[Proc, dict[str, Path]], path: str, accept: str
) -> None:
    """Discovery says ``public`` (and its 304 too), everything else ``no-cache, private``: an HTTP
    cache (kubectl's discovery cache) keeps what the proxy says, so it says what kube says."""
    proxy, pki = kube_proxy
    direct = ssl.create_default_context(cafile=os.environ["KUBE_REFERENCE_CA"])
    host, port = os.environ["KUBE_REFERENCE_URL"].removeprefix("https://").rsplit(":", 1)
    via = ssl.create_default_context(cafile=str(pki["ca.crt"]))
    want = _cache_control(host, int(port), direct, path, Accept=accept)
    got = _cache_control("127.0.0.1", _port(proxy), via, path, Accept=accept)
    assert got[:2] == want[:2] and len(want[1]) == 1
    if want[2]:  # an ETag: the 304 as well
        want304 = _revalidated(host, int(port), direct, path, accept)
        got304 = _revalidated("127.0.0.1", _port(proxy), via, path, accept)
        assert got304[:2] == want304[:2] and want304[0] == 304

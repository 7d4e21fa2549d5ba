"""The reference kit as the tier sees it: its environment, a JSON client, and watchcache in front of it.

``shared/tools/kube-reference`` runs a real etcd and kube-apiserver v1.36 on loopback; env.sh exports
``KUBE_REFERENCE_*``. Without them every test of this tier skips with the README's reason: CI has no
kit, and a test never builds or starts it.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest

from harness.pki import Pair, Pki
from harness.processes import Proc, start

NO_KIT = "no reference kube-apiserver: see shared/tools/kube-reference/README.md"
needs_kube = pytest.mark.skipif(not os.environ.get("KUBE_REFERENCE_KUBECONFIG"), reason=NO_KIT)

# What watchcache caches by default, plus what the control-plane scenario adds (a CRD's resource).
DEFAULT_RESOURCES = (
    "pods,nodes,namespaces,services,configmaps,serviceaccounts,endpoints,apps/v1/deployments,"
    "apps/v1/replicasets,apps/v1/statefulsets,apps/v1/daemonsets,discovery.k8s.io/v1/endpointslices"
)


@dataclass(frozen=True)
class KubeEnv:
    """``KUBE_REFERENCE_*`` as env.sh exports them."""

    url: str
    kubeconfig: str
    token: str
    nobody_token: str
    ca: str
    bin: Path
    home: Path
    control_plane: bool
    front_proxy: Pair | None = None  # the request-header client certificate the apiserver believes

    def issue_client_cert(self, workdir: Path, name: str, subject: str) -> Pair:
        """A client certificate signed by the kit's CA (which the apiserver trusts), made from a copy
        of the CA in ``workdir`` so that nothing is written into the kit's pki/."""
        pki = self.home / "pki"
        ca = Pair(workdir / "kit-ca.crt", workdir / "kit-ca.key")
        ca.crt.write_bytes((pki / "ca.crt").read_bytes())
        ca.key.write_bytes((pki / "ca.key").read_bytes())
        ca.key.chmod(0o600)
        try:
            return Pki(workdir).issue(ca, name, subject)
        finally:
            ca.key.unlink()

    @classmethod
    def from_environ(cls) -> KubeEnv:
        e = os.environ
        if not e.get("KUBE_REFERENCE_KUBECONFIG"):
            pytest.skip(NO_KIT)
        return cls(
            e["KUBE_REFERENCE_URL"],
            e["KUBE_REFERENCE_KUBECONFIG"],
            e["KUBE_REFERENCE_TOKEN"],
            e.get("KUBE_REFERENCE_NOBODY_TOKEN", ""),
            e["KUBE_REFERENCE_CA"],
            Path(e.get("KUBE_REFERENCE_BIN", "")),
            Path(e.get("KUBE_REFERENCE_HOME", "")),
            e.get("KUBE_REFERENCE_CONTROL_PLANE") == "1",
            Pair(Path(e["KUBE_REFERENCE_FRONT_PROXY_CERT"]), Path(e["KUBE_REFERENCE_FRONT_PROXY_KEY"]))
            if e.get("KUBE_REFERENCE_FRONT_PROXY_CERT")
            else None,
        )


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {str(body)[:300]}")
        self.status = status
        self.body = body


class Api:
    """A JSON client of one server (the apiserver or the proxy), keep-alive, one connection per thread."""

    def __init__(self, url: str, token: str | None, ca_file: str | None, *, timeout: float = 30.0) -> None:
        self.url = url
        self.token = token
        self.ca_file = ca_file
        self.timeout = timeout
        self._local = threading.local()
        parts = urlsplit(url)
        assert parts.hostname and parts.port
        self.host, self.port, self.tls = parts.hostname, parts.port, parts.scheme == "https"

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            return http.client.HTTPSConnection(self.host, self.port, context=ctx, timeout=timeout or self.timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def headers(self, accept: str | None = "application/json") -> dict[str, str]:
        out = {"User-Agent": "watchcache-reference"}
        if accept:
            out["Accept"] = accept
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def raw(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        accept: str | None = "application/json",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on this thread's connection (reopened once if the server closed it)."""
        hdrs = {**self.headers(accept), **(headers or {})}
        if body is not None:
            hdrs["Content-Type"] = content_type
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connect()
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        """The decoded JSON answer; raises ApiError on a status >= 300."""
        data = json.dumps(body).encode() if body is not None else None
        status, _, raw = self.raw(method, path, data, content_type=content_type)
        doc = json.loads(raw) if raw[:1] == b"{" else raw.decode(errors="replace")
        if status >= 300:
            raise ApiError(status, doc)
        return doc

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", with_query(path, **params))

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    def create(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def merge_patch(self, path: str, patch: Any) -> Any:
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")

    def delete(self, path: str, *, missing_ok: bool = True, **options: Any) -> Any:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **options} if options else None
        try:
            return self.call("DELETE", path, body)
        except ApiError as e:
            if missing_ok and e.status == 404:
                return None
            raise

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def with_query(path: str, **params: Any) -> str:
    params = {k: ("true" if v is True else "false" if v is False else v) for k, v in params.items() if v is not None}
    return f"{path}?{urlencode(params, quote_via=quote)}" if params else path


def wait_for(condition: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll ``condition()`` until it is truthy; the seconds it took. Fails with ``what`` after ``timeout``."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if condition():
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout:.0f} s")
        time.sleep(interval)


@dataclass
class Serving:
    """A test CA and a serving certificate for 127.0.0.1 signed by it."""

    ca: Pair
    server: Pair

    @classmethod
    def make(cls, root: Path) -> Serving:
        pki = Pki(root)
        ca = pki.ca("serving-ca", "/CN=watchcache-reference-ca")
        return cls(ca, pki.issue(ca, "serving", "/CN=127.0.0.1", ip_san="127.0.0.1"))


def start_proxy(kube: KubeEnv, serving: Serving, *args: str, resources: str = DEFAULT_RESOURCES) -> Proc:
    """``watchcache serve`` in front of the apiserver over TLS, delegated authentication, default
    workers; its own identity is the kit's admin kubeconfig. Returns once /readyz is 200."""
    proc = start(
        "serve", "--kubeconfig", kube.kubeconfig,
        "--tls-cert-file", str(serving.server.crt), "--tls-private-key-file", str(serving.server.key),
        "--authentication", "delegated", "--resources", resources, *args,
        timeout=60,
    )  # fmt: skip
    api = Api(proc.url, kube.token, str(serving.ca.crt), timeout=5)
    try:
        wait_for(lambda: _ready(api), 60, "the proxy's /readyz")
    except AssertionError:
        proc.stop()
        raise AssertionError("proxy not ready:\n" + "".join(proc.log[-40:])) from None
    finally:
        api.close()
    return proc


def _ready(api: Api) -> bool:
    try:
        return api.raw("GET", "/readyz")[0] == 200
    except OSError:
        return False


def write_kubeconfig(path: Path, server: str, ca_file: str, token: str | None, cert: Pair | None = None) -> Path:
    """A kubeconfig for ``server`` with the CA that signed its certificate, and a bearer token or a
    client certificate."""
    user: dict[str, str] = {"token": token} if token else {}
    if cert is not None:
        user = {"client-certificate": str(cert.crt), "client-key": str(cert.key)}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "target", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "target", "context": {"cluster": "target", "user": "user"}}],
        "current-context": "target",
    }
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def drop_namespace(api: Api, namespace: str, collections: tuple[str, ...]) -> None:
    """Delete a test namespace without a controller manager: its content first (``collections``, e.g.
    ``configmaps`` or ``/apis/g/v1/namespaces/{ns}/things``), then the namespace, finalized by hand (a
    namespace finalized with content left would leave that content in etcd)."""
    base = f"/api/v1/namespaces/{namespace}"
    if not api.exists(base):
        return
    for collection in collections:
        path = collection.format(ns=namespace) if collection.startswith("/") else f"{base}/{collection}"
        try:
            api.delete(path, gracePeriodSeconds=0)
        except ApiError as e:
            if e.status != 404:  # a CRD's resource may be gone already
                raise
    api.delete(base)
    try:
        api.call("PUT", f"{base}/finalize", {"metadata": {"name": namespace}, "spec": {"finalizers": []}})
    except ApiError as e:
        if e.status != 404:
            raise
    wait_for(lambda: not api.exists(base), 60, f"namespace {namespace} gone")

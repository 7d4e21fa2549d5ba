"""An exec credential plugin against the real kube-apiserver v1.36: tokens that stop working.

The plugin mints a real ServiceAccount token on each run (TokenRequest, bound to a Secret it creates:
deleting the Secret makes the apiserver refuse the token at once) and reports an expiry of its own.
Consistent reads through the proxy are served from the cache only with a proof the proxy asks the
apiserver for with its own credential; without it they pass through as the client, who has none
here, and get kube's 401. So a 200 says the proxy's current credential works. Runs only with the
reference control plane (``eval "$(shared/tools/kube-reference/env.sh)"``).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.processes import Proc, start, wait_logged, wait_ready
from tests.support.httpkube import get

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver: see shared/tools/kube-reference/README.md",
)

NAMESPACE = "i22-exec-credentials"  # this branch's namespace in the shared apiserver
ROLE = "i22-exec-credentials-watchcache"

PLUGIN = """\
#!{python}
# Mints a ServiceAccount token bound to a new Secret; reports the expiry in STATE/ttl (seconds).
import datetime, json, os, ssl, sys, time, urllib.request
state, url, ns = {state!r}, {url!r}, {namespace!r}
ctx = ssl.create_default_context(cafile={ca!r})
def call(method, path, body):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode(),
        headers={{"Authorization": "Bearer " + {admin!r}, "Content-Type": "application/json"}})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return json.load(resp)
runs = [l for l in open(os.path.join(state, "runs.jsonl"))] if os.path.exists(os.path.join(state, "runs.jsonl")) else []
name = "bound-%d" % (len(runs) + 1)
secret = call("POST", "/api/v1/namespaces/%s/secrets" % ns, {{"metadata": {{"name": name}}}})
bound = {{"kind": "Secret", "apiVersion": "v1", "name": name, "uid": secret["metadata"]["uid"]}}
review = call("POST", "/api/v1/namespaces/%s/serviceaccounts/watchcache/token" % ns,
              {{"spec": {{"expirationSeconds": 600, "boundObjectRef": bound}}}})
ttl = float(open(os.path.join(state, "ttl")).read())
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=ttl)
with open(os.path.join(state, "runs.jsonl"), "a") as f:
    f.write(json.dumps({{"secret": name, "time": time.time()}}) + "\\n")
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": review["status"]["token"],
                             "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}}}))
"""


class Kube:
    def __init__(self) -> None:
        self.url = os.environ["KUBE_REFERENCE_URL"]
        self.ca = os.environ["KUBE_REFERENCE_CA"]
        self.admin = os.environ["KUBE_REFERENCE_TOKEN"]
        self.ctx = ssl.create_default_context(cafile=self.ca)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.admin}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


RBAC = "/apis/rbac.authorization.k8s.io/v1"


def cleanup(k: Kube) -> None:
    k.call("DELETE", f"{RBAC}/clusterrolebindings/{ROLE}")
    k.call("DELETE", f"{RBAC}/clusterroles/{ROLE}")
    status, secrets = k.call("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets")
    for item in secrets.get("items", []) if status == 200 else []:
        if item["metadata"]["name"].startswith("bound-"):
            k.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/{item['metadata']['name']}")
    k.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/watchcache")


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    k = Kube()
    if k.call("GET", f"/api/v1/namespaces/{NAMESPACE}")[0] == 404:
        status, body = k.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        assert status == 201, body
    cleanup(k)
    sa = {"metadata": {"name": "watchcache"}}
    assert k.call("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", sa)[0] == 201
    role = {
        "metadata": {"name": ROLE},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    }
    assert k.call("POST", f"{RBAC}/clusterroles", role)[0] == 201
    binding = {
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "watchcache", "namespace": NAMESPACE}],
    }
    assert k.call("POST", f"{RBAC}/clusterrolebindings", binding)[0] == 201
    yield k
    cleanup(k)


def runs(state: Path) -> list[dict[str, Any]]:
    path = state / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def consistent_list(proxy: Proc) -> int:
    """A consistent LIST without client credentials: 200 only if the proxy's own proof succeeded."""
    return get(proxy.url, f"/api/v1/namespaces/{NAMESPACE}/configmaps").status


def test_exec_plugin_tokens_that_expire_and_are_revoked(kube: Kube, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "ttl").write_text("5")
    plugin = tmp_path / "mint-token"
    plugin.write_text(
        PLUGIN.format(
            python=sys.executable, state=str(state), url=kube.url, namespace=NAMESPACE, ca=kube.ca, admin=kube.admin
        )
    )
    plugin.chmod(0o755)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ref",
        "clusters": [{"name": "ref", "cluster": {"server": kube.url, "certificate-authority": kube.ca}}],
        "users": [
            {
                "name": "plugin",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": str(plugin),
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "ref", "context": {"cluster": "ref", "user": "plugin"}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    proxy = start(
        "serve", "--kubeconfig", str(tmp_path / "kubeconfig"), "--workers", "1", "--authentication", "none",
        "--resources", "configmaps", "--consistent-passthrough-objects", "0",
    )  # fmt: skip
    try:
        wait_ready(proxy, 60)
        assert consistent_list(proxy) == 200
        assert [r["secret"] for r in runs(state)] == ["bound-1"]
        # 1. The credential expires (by the plugin's word): the proxy runs the plugin before using it
        # again. The old token is then revoked, so only the new one can prove the next read.
        (state / "ttl").write_text("600")
        time.sleep(max(0.0, runs(state)[0]["time"] + 5.5 - time.time()))
        assert kube.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/bound-1")[0] == 200
        # The read waits for the plugin (a Python process and two API calls): on a loaded machine that
        # can outlast --fresh-wait, and that read passes through (401); the next has the new token.
        deadline = time.monotonic() + 30
        while consistent_list(proxy) != 200:
            assert time.monotonic() < deadline, "".join(proxy.log[-30:])
            time.sleep(0.2)
        assert [r["secret"] for r in runs(state)] == ["bound-1", "bound-2"]
        # 2. The apiserver refuses the credential before its expiry (its Secret is deleted; the
        # apiserver notices within its token cache's 10 s): the proxy's request that meets the 401
        # fails (a consistent read then passes through as the anonymous client: 401), and the plugin
        # runs again before the next one (its credential is good for 10 minutes: only the 401 does it).
        assert kube.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/bound-2")[0] == 200
        deadline = time.monotonic() + 40
        seen = set()
        while len(runs(state)) < 3 or consistent_list(proxy) != 200:
            assert time.monotonic() < deadline, f"no re-run after the 401 (reads: {seen})\n" + "".join(proxy.log[-30:])
            seen.add(consistent_list(proxy))
            time.sleep(0.2)
        assert [r["secret"] for r in runs(state)] == ["bound-1", "bound-2", "bound-3"]
        wait_logged(proxy, lambda line: "answered 401 to the exec plugin's credential" in line)
    finally:
        proxy.stop()

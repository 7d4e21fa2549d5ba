"""A real client-go credential plugin for tests: an executable script that prints an ExecCredential.

Its state is a directory: ``token`` (what it hands out), ``ttl`` (seconds until the credential
expires; absent: never), ``cert``/``key`` (a client certificate instead), ``fail`` (exit 1 with its
text on stderr). Every run appends a line to ``runs.jsonl``: the ``KUBERNETES_EXEC_INFO`` it got,
``PLUGIN_ENV`` (set by the kubeconfig's ``env``), whether stdin was a terminal, and the time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

SCRIPT = """\
#!{python}
import datetime, json, os, sys, time
state = {state!r}
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
def read(name):
    path = os.path.join(state, name)
    return open(path).read().strip() if os.path.exists(path) else None
token, ttl, cert, key, fail = read("token"), read("ttl"), read("cert"), read("key"), read("fail")
with open(os.path.join(state, "runs.jsonl"), "a") as f:
    f.write(json.dumps({{"info": info, "env": os.environ.get("PLUGIN_ENV"), "stdin_tty": sys.stdin is not None
                        and not sys.stdin.closed and sys.stdin.isatty(), "time": time.time(), "token": token}}) + "\\n")
if fail:
    print(fail, file=sys.stderr)
    sys.exit(1)
status = {{}}
if token:
    status["token"] = token
if cert:
    status["clientCertificateData"] = open(cert).read()
    status["clientKeyData"] = open(key).read()
if ttl:
    expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(ttl))
    status["expirationTimestamp"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


class ExecPlugin:
    def __init__(self, root: Path) -> None:
        self.state = root / "plugin-state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.command = root / "credential-plugin"
        self.command.write_text(SCRIPT.format(python=sys.executable, state=str(self.state)))
        self.command.chmod(0o755)

    def set(self, name: str, value: str | None) -> None:
        path = self.state / name
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(value)

    def runs(self) -> list[dict[str, Any]]:
        path = self.state / "runs.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kubeconfig(
    path: Path,
    server: str,
    plugin: ExecPlugin,
    *,
    api_version: str = "client.authentication.k8s.io/v1",
    ca_b64: str | None = None,
    cluster: dict[str, Any] | None = None,
    interactive_mode: str = "Never",
) -> Path:
    """A kubeconfig whose one context's user is ``plugin`` (provideClusterInfo, an env variable, and
    the exec extension on the cluster)."""
    body: dict[str, Any] = {"server": server, **(cluster or {})}
    if ca_b64:
        body["certificate-authority-data"] = ca_b64
    body["extensions"] = [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "watchcache-tests"}}]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "exec",
        "clusters": [{"name": "c", "cluster": body}],
        "users": [
            {
                "name": "plugin-user",
                "user": {
                    "exec": {
                        "apiVersion": api_version,
                        "command": str(plugin.command),
                        "args": [],
                        "env": [{"name": "PLUGIN_ENV", "value": "from-kubeconfig"}],
                        "interactiveMode": interactive_mode,
                        "provideClusterInfo": True,
                    }
                },
            }
        ],
        "contexts": [{"name": "exec", "context": {"cluster": "c", "user": "plugin-user"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path

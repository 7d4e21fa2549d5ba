"""Flow control's configuration watched through real processes: the simulated cluster serves
flowcontrol.apiserver.k8s.io/v1 (``sim --flowcontrol``, kube's suggested objects), the proxy lists
and watches it, and a FlowSchema created or deleted there classifies the next request."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.processes import Proc, start_stack

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
FS = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("apf-watch") / "token"
    token_file.write_text("watchcache-token")
    stack = start_stack(
        "--token-file", str(token_file), "--authentication", "delegated",
        "--workers", "1",
        sim_args=("--objects", "10", "--namespaces", "2", "--policy-file", POLICY, "--flowcontrol"),
    )  # fmt: skip
    yield stack.sim, stack.proxy
    stack.stop()


def _call(url: str, token: str, method: str = "GET", body: Any = None) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {token}"})
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")


def _schema_of_alice(proxy: Proc) -> str:
    _, headers, _ = _call(proxy.url + "/api/v1/pods", "alice-token")
    return headers["X-Kubernetes-PF-FlowSchema-UID"]


def _until(proxy: Proc, uid: str) -> float:
    """Seconds until alice's requests are classified by the schema ``uid`` (at most 10 s)."""
    started = time.monotonic()
    while _schema_of_alice(proxy) != uid:
        assert time.monotonic() - started < 10, f"still not {uid}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_flow_schema_created_and_deleted_upstream_applies_live(stack: tuple[Proc, Proc]) -> None:
    sim, proxy = stack
    _, _, listing = _call(sim.url + FS, "admin-token")
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in listing["items"]}
    _until(proxy, uids["global-default"])  # the sim's objects, not the proxy's own defaults
    with urllib.request.urlopen(proxy.url + "/readyz?verbose", timeout=10) as resp:
        ready = resp.read().decode()
    assert "priority-and-fairness ok (configuration: the upstream's (11 FlowSchemas, 8 priority levels), watched)" in (
        ready
    )

    mine = next(o for o in listing["items"] if o["metadata"]["name"] == "global-default")
    rule = {**mine["spec"]["rules"][0], "subjects": [{"kind": "User", "user": {"name": "alice"}}]}
    spec = {**mine["spec"], "matchingPrecedence": 50, "priorityLevelConfiguration": {"name": "workload-high"}}
    mine = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": "alice-first"},
        "spec": {**spec, "rules": [rule]},
    }
    status, _, created = _call(sim.url + FS, "admin-token", "POST", mine)
    assert status == 201
    took = _until(proxy, created["metadata"]["uid"])
    _call(sim.url + FS + "/alice-first", "admin-token", "DELETE")
    took_back = _until(proxy, uids["global-default"])
    print(f"created applied after {took * 1000:.0f} ms, deleted after {took_back * 1000:.0f} ms")
    assert took < 2 and took_back < 2  # a watch event, not a 10 s poll

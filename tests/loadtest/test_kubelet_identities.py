"""The kubelet connect burst with real node identities, through watchcache and direct to kube-apiserver v1.36.

Each simulated kubelet presents its own node's client certificate (``system:node:<node>`` in
``system:nodes``, signed by the kit's CA: ``loadtest/bench/nodecerts.py``), GETs its Node and
list-watches its pods (``spec.nodeName``), its Node and the ConfigMaps its pods mount: what kube's
Node authorizer allows a node (KEP-4601 selectors), so every request succeeds only if the proxy's
SubjectAccessReviews carry the selectors and its objects exist. Both servers classify them alike:
kube's ``system-nodes`` (pods, ConfigMaps) and ``system-node-high`` (the Node) FlowSchemas.

A small K of the benchmark itself (``loadtest.bench.kubelets --node-identities --connect-only``);
its namespace is kept (``--keep``, prefix ``nodeburst-test``): the kit runs no controller manager,
so a deleted namespace would stay Terminating and the next run could not create its pods. Its Nodes
and pods are deleted after it, though: left in the kit, kube-scheduler (started by the control-plane
tests) places pods on those Nodes, which no kubelet runs, and a rollout there never completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from harness.kube.kit import Api, KubeEnv, needs_kube
from loadtest.bench import lib as bl

pytestmark = needs_kube

K = 6


def run_bench() -> dict[str, Any]:
    env, cwd = bl.child_env()
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.bench.kubelets", "--upstream", "kube", "--node-identities", "--connect-only",
         "--kubelets", str(K), "--spare-nodes", "0", "--pods-per-node", "2", "--configmaps", "20", "--h2",
         "--idle", "0.5", "--settle", "0.5", "--client-procs", "1", "--connect-timeout", "60",
         "--prefix", "nodeburst-test", "--keep"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("BENCH ")]
    result: dict[str, Any] = json.loads(line[6:])
    return result


def _delete_nodes_and_pods() -> None:
    """The run's Nodes and pods (cluster-scoped Nodes and pods need no controller to go)."""
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    try:
        for node in api.get("/api/v1/nodes")["items"]:
            name = node["metadata"]["name"]
            if name.startswith("nodeburst-test-"):
                api.delete(f"/api/v1/nodes/{name}")
        api.call("DELETE", "/api/v1/namespaces/nodeburst-test-kubelets/pods?gracePeriodSeconds=0", None)
    finally:
        api.close()


def test_node_identities_connect_through_the_proxy_as_directly_and_are_classified_as_nodes() -> None:
    try:
        result = run_bench()
    finally:
        _delete_nodes_and_pods()
    idle = {r["target"]: r for r in result["rows"] if r["phase"] == "idle"}
    assert set(idle) == {"proxy", "upstream"}
    for target, row in idle.items():
        # 4 watches per kubelet: its pods, its Node, the 2 ConfigMaps its 2 pods mount; and its Node GET.
        assert row["watches"] == row["established"] == 4 * K, (target, row)
        assert row["node_gets"] == row["node_gets_ok"] == K, (target, row)
        assert row["failed_requests"] == {}, (target, row)
    # The same classification and request count on both: Node GET + LIST + WATCH at node-high, the
    # pods' and ConfigMaps' LIST + WATCH at system (flow schema system-nodes); nothing refused.
    expected = {"node-high/system-node-high": 3 * K, "system/system-nodes": 2 * 3 * K}
    for target, row in idle.items():
        flow = row["flowcontrol"]
        assert {k: v.get("dispatched") for k, v in flow.items()} == expected, (target, flow)
        assert not any(v.get("rejected") for v in flow.values()), (target, flow)

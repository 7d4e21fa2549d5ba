"""The kubelet benchmark's node identities (``nodecerts``) and its reading of flow-control metrics (``flowmetrics``)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from harness.pki import Pki
from loadtest.bench import flowmetrics, nodecerts


def subject(crt: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(crt), "-noout", "-subject", "-ext", "extendedKeyUsage"],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return out.stdout


def test_node_certificates_are_issued_once_by_the_ca_and_reissued_when_old(tmp_path: Path) -> None:
    ca = Pki(tmp_path).ca("ca", "/CN=test-ca")
    root = tmp_path / "cache"
    nodes = ["n-00000", "n-00001"]
    d = nodecerts.ensure(nodes, ca.crt, ca.key, root=root)
    assert d.parent == root
    crt, key = nodecerts.pair(d, "n-00001")
    text = subject(crt)
    assert "O = system:nodes, CN = system:node:n-00001" in text and "TLS Web Client Authentication" in text
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(ca.crt), str(crt)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    assert key.stat().st_mode & 0o777 == 0o600
    issued = crt.read_bytes()
    assert nodecerts.ensure(nodes, ca.crt, ca.key, root=root) == d
    assert crt.read_bytes() == issued  # cached: not issued again
    old = time.time() - nodecerts.REISSUE_AFTER_S - 60
    os.utime(crt, (old, old))
    nodecerts.ensure(nodes, ca.crt, ca.key, root=root)
    assert crt.read_bytes() != issued
    assert not list(d.glob("*.tmp"))


def test_a_kubelet_watches_only_the_configmaps_its_pods_mount() -> None:
    assert nodecerts.cm_per_kubelet(5, 2, "") == 5  # a token: any ConfigMap
    assert nodecerts.cm_per_kubelet(5, 2, "/certs") == 2
    assert nodecerts.cm_per_kubelet(5, 10, "/certs") == 5


NODES = 'flow_schema="system-nodes",priority_level="system"'
WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
METRICS = f"""\
# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{{{NODES}}} 120
apiserver_flowcontrol_dispatched_requests_total{{flow_schema="exempt",priority_level="exempt"}} 7
apiserver_flowcontrol_rejected_requests_total{{{NODES},reason="time-out"}} 3
{WAIT}_sum{{execute="true",{NODES}}} 0.6
{WAIT}_count{{execute="true",{NODES}}} 120
{WAIT}_bucket{{execute="true",{NODES},le="0.005"}} 100
apiserver_request_total{{code="200"}} 5
"""


def test_flow_control_metrics_summarized_per_level_and_schema_over_a_phase() -> None:
    before = flowmetrics.parse(
        METRICS.replace(" 120\n", " 20\n").replace('"time-out"} 3', '"time-out"} 1').replace("} 0.6\n", "} 0\n")
    )
    after = flowmetrics.parse(METRICS)
    summary = flowmetrics.summary(flowmetrics.delta(before, after), ("system-nodes",))
    # 100 dispatched and 2 refused in the phase; wait: 0.6 s over 100 dispatched (the sum moved by 0.6 s)
    assert summary == {"system/system-nodes": {"dispatched": 100, "rejected": {"time-out": 2}, "wait_mean_ms": 6.0}}
    assert "exempt/exempt" in flowmetrics.summary(flowmetrics.delta({}, after))

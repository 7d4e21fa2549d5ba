"""Reference tier: two independent proxy replicas in front of the real kube-apiserver; one dies, its
clients resume on the other.

The promise: resource versions pass through unchanged, so every replica shares the upstream's
version space and a client can resume anywhere. Setup (``tests.reliability.failover``): two
``watchcache serve --workers 2 --resources configmaps --kubeconfig KIT`` replicas with one
continue-token key, behind one address (a relay, as a Service: new connections to replica A, after
the fault to B); a writer updating ConfigMaps at 40/s on the apiserver, in one namespace of our own
(``i49f-failover-*``); 24 informer-style clients through the relay; the authoritative log is what a
recorder watching the apiserver directly saw. Before the fault, a LIST of the namespace (all, and by
label) is paged across the replicas — page 1 from A, page 2 from B, ... — and must equal one Exact
LIST of the apiserver at page 1's rv, in order, without duplicates. The fault: SIGKILL of A's process
group (``failover-sigkill``), SIGTERM after the Service moved (``failover-sigterm``), SIGKILL with B
lagging 1 s behind the apiserver (``-lagging``: clients come with rvs B has not reached), SIGKILL
with the Service routing to the dead A for 80 more writes while B keeps 1 s of history (``-late``:
clients come with rvs older than B's window; B backfills from the apiserver). Verdict: 0
relists and 0 410s, every update seen once and in order by every client (no relist diff accepted),
every client at the apiserver's head with its state, no traceback in either replica's log.

Run: ``eval "$(../shared/tools/kube-reference/env.sh)"``, then
``.venv/bin/pytest -q -s tests/reference/test_replica_failover.py -p no:randomly``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from harness.kube.kit import Api, KubeEnv, drop_namespace, needs_kube, write_kubeconfig
from harness.relay import Relay
from tests.reliability.failover import (
    FAILOVER_FAULTS,
    STANDBY_ARGS,
    FailoverScenario,
    ReplicaService,
    assert_failover_verdict,
)
from tests.reliability.restarts import Outcome, ProxyGroup, Recorder, ScenarioOptions, Target, free_port, proxy_argv

pytestmark = [pytest.mark.reference, needs_kube]


async def run_on_kube(
    kube: KubeEnv, namespace: str, opts: ScenarioOptions, workdir: Path
) -> tuple[Outcome, FailoverScenario]:
    upstream = Target(kube.url, kube.token, kube.ca)
    key = workdir / "continue-token.key"
    key.write_text(secrets.token_hex(32))
    extra = (*opts.proxy_args, "--continue-token-key-file", str(key))
    # B reaches the apiserver through a relay (a clean wire until a "-lagging" fault slows it).
    host, _, port = kube.url.removeprefix("https://").rpartition(":")
    link = Relay(host, int(port))
    linked = write_kubeconfig(
        workdir / "b.kubeconfig", f"https://{host}:{await link.start('127.0.0.1', 0)}", kube.ca, kube.token
    )
    replicas = []
    for name, kubeconfig in (("a", kube.kubeconfig), ("b", str(linked))):
        port = free_port()
        more = STANDBY_ARGS.get(opts.fault, ()) if name == "b" else ()
        argv = proxy_argv(port, ["--kubeconfig", kubeconfig], opts.workers, (*extra, *more))
        replicas.append(ProxyGroup(argv, workdir / f"replica-{name}.log", port))
    service = ReplicaService.of(replicas, workdir)
    recorder = Recorder(upstream, namespace)
    scenario = FailoverScenario(
        opts, upstream, service, lambda: recorder.entries, recorder=recorder, standby_link=link, standby_lag=1.0
    )
    try:
        return await scenario.run(), scenario
    finally:
        await service.close()
        await link.close()


@pytest.mark.parametrize("fault", list(FAILOVER_FAULTS))
@pytest.mark.timeout(300)
def test_the_clients_of_a_dead_replica_resume_on_another_without_relisting(fault: str, tmp_path: Path) -> None:
    import uvloop

    kube = KubeEnv.from_environ()
    namespace = f"i49f-{fault}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    api = Api(kube.url, kube.token, kube.ca)
    drop_namespace(api, namespace, ("configmaps",))
    api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    opts = ScenarioOptions(fault=fault, namespaces=(namespace,), cluster_wide=False, step_timeout=90.0)
    try:
        outcome, scenario = uvloop.run(run_on_kube(kube, namespace, opts, tmp_path))
    finally:
        drop_namespace(api, namespace, ("configmaps",))
        api.close()
    assert_failover_verdict(scenario, outcome)

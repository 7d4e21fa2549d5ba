"""Issue 20, reference tier: a proxy restart mid-churn in front of the real kube-apiserver costs nothing.

The issue's setup: ``watchcache serve --workers 2 --resources configmaps --kubeconfig KIT`` in front
of the kit's kube-apiserver v1.36, 24 informer-style clients through it (namespaced watches and
label selectors of one namespace of our own, ``i20t-restarts-*``), a writer updating ConfigMaps
at 40/s on the apiserver; mid-churn a fault (SIGTERM and a new process on the same port as the
issue reports; also SIGKILL of the proxy, and SIGKILL of the owner worker). The authoritative log
is what a recorder watching the apiserver directly saw (``tests.reliability.restarts.Recorder``).
Verdict as the suite tier's: 0 relists, every update seen once and in order by every client, the
final state equal to the apiserver's.

Run: ``eval "$(../shared/tools/kube-reference/env.sh)"; .venv/bin/pytest -q -s tests/reference/test_restarts.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.kube.kit import Api, KubeEnv, drop_namespace, needs_kube
from tests.reliability.restarts import (
    FAULTS,
    Outcome,
    ProxyGroup,
    Recorder,
    RestartScenario,
    ScenarioOptions,
    Target,
    free_port,
    proxy_argv,
)

pytestmark = [pytest.mark.reference, needs_kube]


async def run_on_kube(kube: KubeEnv, namespace: str, opts: ScenarioOptions, workdir: Path) -> Outcome:
    upstream = Target(kube.url, kube.token, kube.ca)
    port = free_port()
    proxy = ProxyGroup(
        proxy_argv(port, ["--kubeconfig", kube.kubeconfig], opts.workers, opts.proxy_args), workdir / "proxy.log", port
    )
    recorder = Recorder(upstream, namespace)
    scenario = RestartScenario(opts, upstream, proxy, lambda: recorder.entries, recorder=recorder)
    try:
        return await scenario.run()
    finally:
        proxy.stop()


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.timeout(300)
def test_a_proxy_restart_in_front_of_kube_apiserver_costs_the_informers_nothing(fault: str, tmp_path: Path) -> None:
    import uvloop

    kube = KubeEnv.from_environ()
    namespace = f"i20t-restarts-{fault}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    api = Api(kube.url, kube.token, kube.ca)
    drop_namespace(api, namespace, ("configmaps",))
    api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    opts = ScenarioOptions(fault=fault, namespaces=(namespace,), cluster_wide=False, step_timeout=90.0)
    try:
        outcome = uvloop.run(run_on_kube(kube, namespace, opts, tmp_path))
    finally:
        drop_namespace(api, namespace, ("configmaps",))
        api.close()
    print(outcome.summary())
    assert outcome.clients >= 20 and outcome.writes > 150
    assert outcome.problems() == [], outcome.summary()

"""The same control plane, the same scenario: pointed at the apiserver, then at watchcache in front of it.

Used by ``test_control_plane.py`` (one round, with the verdicts) and by
``loadtest/bench/reference_control_plane.py`` (several rounds, the table of ranges for the docs).

The components' kubeconfig holds the admin token and the server: the apiserver, or the proxy
(its test CA). ``--authentication-kubeconfig``/``--authorization-kubeconfig`` are the same file,
so in the proxy run everything the components do goes through the proxy: also the
``kube-system/extension-apiserver-authentication`` ConfigMap informer they start with (cached),
and the TokenReviews/SubjectAccessReviews for requests to their own ports (passed through).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.kube.controlplane import PATTERNS, ControlPlane
from harness.kube.crds import CRDS, delete_crd
from harness.kube.kit import DEFAULT_RESOURCES, Api, KubeEnv, Serving, start_proxy, wait_for, write_kubeconfig
from harness.kube.kubelet import FakeKubelet
from harness.kube.scenario import CRD_NAME, CRD_RESOURCE, STEPS, Scenario, ensure_crd

TARGETS = ("direct", "proxy")
# A step through the proxy may take 1.5x its time direct, or FLOOR seconds, whichever is more:
# sub-second steps are dominated by 50 ms polling and by the controllers' own queues and
# batching, where a ratio means nothing.
RATIO = 1.5
FLOOR = 1.0


@dataclass
class Run:
    target: str
    times: dict[str, float]
    counts: dict[str, Counter[str]]
    synced: float  # seconds from start until the controllers were synced


@dataclass
class Comparison:
    runs: list[Run] = field(default_factory=list)
    kubelet_errors: list[str] = field(default_factory=list)
    proxy_log: list[str] = field(default_factory=list)
    # The proxy's own counts over its runs (its /metrics, summed over workers): requests passed through
    # by reason, how their clients were presented upstream, consistent reads served or passed through.
    passthrough: Counter[str] = field(default_factory=Counter)
    identity_routes: Counter[str] = field(default_factory=Counter)
    # Typed clients' reads of full objects in protobuf, by answer: protobuf-cache, json, passed-through.
    full_protobuf: Counter[str] = field(default_factory=Counter)
    consistent_reads: Counter[str] = field(default_factory=Counter)

    def of(self, target: str) -> list[Run]:
        return [r for r in self.runs if r.target == target]

    def slow_steps(self) -> list[str]:
        """Steps where the proxy's best time is over the allowance of direct's best time."""
        out = []
        for step in STEPS:
            direct = min(r.times[step] for r in self.of("direct"))
            proxy = min(r.times[step] for r in self.of("proxy"))
            if proxy > allowance(direct):
                out.append(f"{step}: {proxy:.2f} s through the proxy, {direct:.2f} s direct")
        return out

    def total(self, target: str, component: str, pattern: str) -> int:
        return sum(r.counts[component][pattern] for r in self.of(target))


def allowance(direct: float) -> float:
    return max(RATIO * direct, FLOOR)


def compare(
    kube: KubeEnv,
    workdir: Path,
    *,
    rounds: int = 1,
    suffix: str = "",
    proxy_args: tuple[str, ...] = (),
    identity: str = "token",
) -> Comparison:
    """``rounds`` x (direct, proxy), each with a fresh controller manager and scheduler; ``proxy_args``
    are added to ``watchcache serve``'s (default: none, so default workers).

    ``identity``: the components authenticate with the admin token (passed through as given), or
    (``certificate``) with a client certificate of ``system:masters`` signed by the cluster's CA, as
    kubeadm's components do: the proxy then verifies it (``--client-ca-file``) and presents the
    apiserver's front-proxy certificate for their pass-through requests (``--client-cert-passthrough
    front-proxy``, the default once ``--proxy-client-cert-file`` is given).
    """
    api = Api(kube.url, kube.token, kube.ca)
    ensure_crd(api)
    serving = Serving.make(workdir)
    token: str | None = kube.token
    cert = None
    if identity == "certificate":
        assert kube.front_proxy is not None, "KUBE_REFERENCE_FRONT_PROXY_CERT unset"
        cert = kube.issue_client_cert(workdir, "control-plane", "/CN=reference-control-plane/O=system:masters")
        token = None
        proxy_args = (
            "--client-ca-file", kube.ca, "--proxy-client-cert-file", str(kube.front_proxy.crt),
            "--proxy-client-key-file", str(kube.front_proxy.key), *proxy_args,
        )  # fmt: skip
    proxy = start_proxy(kube, serving, *proxy_args, resources=f"{DEFAULT_RESOURCES},{CRD_RESOURCE}")
    kubeconfigs = {
        "direct": write_kubeconfig(workdir / "direct.kubeconfig", kube.url, kube.ca, token, cert),
        "proxy": write_kubeconfig(workdir / "proxy.kubeconfig", proxy.url, str(serving.ca.crt), token, cert),
    }
    result = Comparison()
    try:
        with FakeKubelet(api, "reference-node") as kubelet:
            for n in range(rounds):
                for target in TARGETS:
                    namespace = f"reference-{target}{suffix}-{n}"
                    result.runs.append(
                        _run(kube, api, kubeconfigs[target], workdir / f"{target}-{n}", target, namespace)
                    )
            result.kubelet_errors = kubelet.errors
        _scrape(Api(proxy.url, kube.token, str(serving.ca.crt)), result)
    finally:
        proxy.stop()
        result.proxy_log = proxy.log
        delete_crd(api, CRD_NAME)  # gone before the next module (or round) creates it again
        api.close()
    return result


def _run(kube: KubeEnv, api: Api, kubeconfig: Path, workdir: Path, target: str, namespace: str) -> Run:
    scenario = Scenario(api, namespace)
    crds = _crd_names(api)
    started = time.monotonic()
    with ControlPlane(kube, kubeconfig, workdir) as cp:
        cp.wait_synced()
        synced = time.monotonic() - started
        crds |= _crd_names(api)  # the ones its garbage collector discovered as it started
        try:
            times = scenario.run()
        finally:
            # a failed step must not leave its namespace behind (nothing finalizes it without us)
            if api.exists(scenario.ns):
                api.delete(scenario.ns)
                wait_for(lambda: not api.exists(scenario.ns), 120, f"{namespace} deleted after a failure")
        # Another test's CRD deleted meanwhile: its metadata informers' 404s are kube's (controlplane.VANISHED).
        return Run(target, times, cp.counts(crd_vanished=bool(crds - _crd_names(api))), synced)


def _crd_names(api: Api) -> set[str]:
    return {item["metadata"]["name"] for item in api.get(CRDS)["items"]}


def _scrape(proxy: Api, result: Comparison) -> None:
    status, _, body = proxy.raw("GET", "/metrics", accept="text/plain")
    assert status == 200, body[:300]
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "watchcache_passthrough_requests_total":
                result.passthrough[sample.labels["reason"]] += int(sample.value)
            elif sample.name == "watchcache_full_protobuf_requests_total":
                result.full_protobuf[sample.labels["answer"]] += int(sample.value)
            elif sample.name == "watchcache_passthrough_identity_total":
                result.identity_routes[sample.labels["route"]] += int(sample.value)
            elif sample.name == "apiserver_watch_cache_consistent_read_total":
                served = "passed through" if sample.labels.get("fallback") == "true" else "from the cache"
                result.consistent_reads[served] += int(sample.value)


def table(result: Comparison) -> str:
    """Markdown: per step, the times through each target (a range over rounds), and the log counts."""
    rounds = len(result.of("direct"))
    head = "| step | direct (s) | through watchcache (s) | allowed (s) |\n|---|---:|---:|---:|"
    rows = [head]
    for step in STEPS:
        d = [r.times[step] for r in result.of("direct")]
        p = [r.times[step] for r in result.of("proxy")]
        rows.append(f"| {step} | {_range(d)} | {_range(p)} | {allowance(min(d)):.2f} |")
    d_sync = [r.synced for r in result.of("direct")]
    p_sync = [r.synced for r in result.of("proxy")]
    rows.append(f"| (start-up: components synced) | {_range(d_sync)} | {_range(p_sync)} | |")
    rows.append("")
    rows.append(f"Log lines over {rounds} round(s) (direct / through watchcache):")
    rows.append("")
    rows.append("| pattern | kube-controller-manager | kube-scheduler |\n|---|---:|---:|")
    for pattern in PATTERNS:
        cells = [
            f"{result.total('direct', c, pattern)} / {result.total('proxy', c, pattern)}"
            for c in ("kube-controller-manager", "kube-scheduler")
        ]
        rows.append(f"| {pattern} | {' | '.join(cells)} |")
    rows.append("")
    rows.append("watchcache over its runs:")
    rows.append(f"- passed through, by reason: {_counts(result.passthrough)}")
    rows.append(f"- pass-through identity: {_counts(result.identity_routes)}")
    rows.append(f"- reads of full objects in protobuf, by answer: {_counts(result.full_protobuf)}")
    rows.append(f"- consistent reads: {_counts(result.consistent_reads)}")
    return "\n".join(rows)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common() if v) or "none"


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if len(values) == 1 or f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"

"""Where a control plane's start-up time goes, through watchcache and direct.

kube-controller-manager and kube-scheduler (the kit's v1.36 binaries) start, and are "synced"
once every informer has its initial state (``ControlPlane.wait_synced``). docs/deploy.md measured
0.9-1.6 s direct against 2.9-3.4 s through the proxy; this says where the difference goes. Each
component reaches its server through a TLS relay that logs every request
(``harness/kube/requestlog.py``) and when it was answered: a LIST when its response ended, a
watch-list (``sendInitialEvents=true``, what v1.36 informers send) at its ``initial-events-end``
bookmark. Per target (the apiserver directly, or ``watchcache serve`` in front of it, already
running and ready):

* ``first request``: from exec to the components' first request (process start, flags, certificates);
* ``discovery``: the discovery requests (``/api``, ``/apis``, ...): how many, and until the last answered;
* ``informers``: their initial lists (the first LIST or watch-list of each client/collection/selector):
  how many, and the median, p90 and maximum time from request to initial state;
* ``synced``: from exec until both components report their caches synced;
* the slowest informers through each, and the proxy's consistent-read counters.

Runs against a kube-apiserver of our own over the kit's etcd (``harness/kube/private.py``), so the
kit's own controller manager, if it runs, is not disturbed::

    eval "$(../shared/tools/kube-reference/env.sh)"
    .venv/bin/python -m loadtest.bench.reference_startup --rounds 3 [--proxy-args "--workers 1"]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness.kube.controlplane import ControlPlane
from harness.kube.kit import DEFAULT_RESOURCES, Api, KubeEnv, Serving, write_kubeconfig
from harness.kube.private import PrivateApiserver
from harness.kube.requestlog import Logged, RequestLog, _parse
from harness.processes import free_port
from harness.proxygroup import ProxyGroup
from loadtest.chaos.stack import python_m

DISCOVERY = ("/api", "/apis", "/version", "/openapi")


def initial_lists(requests: list[Logged]) -> list[Logged]:
    """The first LIST or watch-list of every informer."""
    seen: set[Any] = set()
    out = []
    for r in requests:
        parsed = _parse(r)
        if parsed is None:
            continue
        informer, q = parsed
        is_list = q.get("sendInitialEvents") == "true" if q.get("watch") in ("1", "true") else "continue" not in q
        if is_list and informer not in seen:
            seen.add(informer)
            out.append(r)
    return out


def analyse(requests: list[Logged], started: float, synced: float) -> dict[str, Any]:
    discovery = [r for r in requests if r.target.split("?")[0].startswith(DISCOVERY) and "/namespaces/" not in r.target]
    lists = initial_lists(requests)
    took = sorted((r.done - r.at, r) for r in lists if r.done is not None)
    seconds = [t for t, _ in took]
    return {
        "first request": min(r.at for r in requests) - started,
        "discovery requests": len(discovery),
        "discovery answered": max((r.done or r.at) for r in discovery) - started if discovery else 0.0,
        "informers": len(lists),
        "informers unanswered": len(lists) - len(took),
        "informer p50": statistics.median(seconds) if seconds else 0.0,
        "informer p90": seconds[int(len(seconds) * 0.9)] if seconds else 0.0,
        "informer max": seconds[-1] if seconds else 0.0,
        "last informer synced": max((t + r.at for t, r in took), default=started) - started,
        "synced": synced,
        "slowest": [f"{t:.2f}s {r.user_agent.split('/')[0]} {r.target.split('?')[0]}" for t, r in took[-5:]],
    }


def consistent_reads(proxy: ProxyGroup, token: str) -> dict[str, float]:
    api = Api(proxy.url, token, proxy.ca_file, timeout=10)
    try:
        _, _, body = api.raw("GET", "/metrics", accept="text/plain")
    finally:
        api.close()
    out: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "apiserver_watch_cache_consistent_read_total":
                out[f"consistent reads fallback={sample.labels.get('fallback')}"] += sample.value
            if sample.name == "watchcache_passthrough_requests_total":
                out[f"passed through: {sample.labels.get('reason')}"] += sample.value
    return dict(out)


def one(kube: KubeEnv, kubeconfig: Path, requests: RequestLog, workdir: Path) -> dict[str, Any]:
    mark = time.monotonic()
    started = time.monotonic()
    with ControlPlane(kube, kubeconfig, workdir) as cp:
        cp.wait_synced()
        synced = time.monotonic() - started
        time.sleep(1.0)  # the last answers are logged
        return analyse(requests.since(mark), started, synced)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--proxy-args", default="", help="more flags for watchcache serve, e.g. '--workers 1'")
    args = parser.parse_args(argv)
    try:
        kit = KubeEnv.from_environ()
    except BaseException as e:  # pytest.skip outside pytest
        print(f"cannot run: {e}", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
    counters: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="reference-startup-") as tmp:
        workdir = Path(tmp)
        private = PrivateApiserver(kit, workdir / "apiserver")
        private.start()
        kube = private.env()
        serving = Serving.make(workdir)
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(serving.server.crt), str(serving.server.key))
        port = free_port()
        argv_ = python_m(
            "watchcache", "serve", "--kubeconfig", kube.kubeconfig, "--listen", f"127.0.0.1:{port}",
            "--tls-cert-file", str(serving.server.crt), "--tls-private-key-file", str(serving.server.key),
            "--authentication", "delegated", "--resources", DEFAULT_RESOURCES, *args.proxy_args.split(),
        )  # fmt: skip
        proxy = ProxyGroup(argv_, workdir / "proxy.log", port, ca_file=str(serving.ca.crt))
        api_port = int(kube.url.rsplit(":", 1)[1])
        trust_kube = ssl.create_default_context(cafile=kube.ca)
        trust_proxy = ssl.create_default_context(cafile=str(serving.ca.crt))
        relays = {
            "direct": RequestLog(("127.0.0.1", api_port), server_ssl, trust_kube),
            "proxy": RequestLog(("127.0.0.1", port), server_ssl, trust_proxy),
        }
        try:
            asyncio.run(proxy.start(120.0))
            kubeconfigs = {
                name: write_kubeconfig(
                    workdir / f"{name}.kubeconfig", f"https://127.0.0.1:{relay.start()}", str(serving.ca.crt),
                    kube.token,
                )
                for name, relay in relays.items()
            }  # fmt: skip
            for n in range(args.rounds):
                for name in ("direct", "proxy"):
                    result = one(kube, kubeconfigs[name], relays[name], workdir / f"{name}-{n}")
                    results[name].append(result)
                    print(f"round {n + 1} {name}: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in result.items() if isinstance(v, float)), flush=True)  # fmt: skip
            counters = consistent_reads(proxy, kube.token)
        finally:
            proxy.stop()
            for relay in relays.values():
                relay.stop()
            private.close()
    keys = [k for k, v in results["direct"][0].items() if isinstance(v, int | float)]
    print(f"\n| (s from exec; median over {args.rounds} rounds, range) | direct | through watchcache |")
    print("|---|---:|---:|")
    for k in keys:
        cells = []
        for name in ("direct", "proxy"):
            values = sorted(r[k] for r in results[name])
            med = statistics.median(values)
            cells.append(f"{med:.2f} ({values[0]:.2f}–{values[-1]:.2f})" if isinstance(med, float) else f"{med}")
        print(f"| {k} | {cells[0]} | {cells[1]} |")
    for name in ("direct", "proxy"):
        print(f"\nslowest informers, {name} (last round):\n  " + "\n  ".join(results[name][-1]["slowest"]))
    print("\nthe proxy's counters over all rounds: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(counters.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much later a watch event arrives through watchcache than from the apiserver, under a burst of writes.

Needs the reference kit (``eval "$(shared/tools/kube-reference/env.sh)"``). Starts ``watchcache
serve`` in front of the apiserver (TLS, delegated authentication), opens the same ConfigMap watch
on both, creates ``--writes`` ConfigMaps from ``--writers`` threads, and prints per watch when each
ADDED event arrived after its create returned, and the difference proxy - direct per event
(p50/p90/max). Explains the ReplicaSet controller's extra "read version is not as new as written
version" requeues through the proxy (docs/deploy.md).

    .venv/bin/python -m loadtest.bench.reference_event_latency [--writes 400] [--writers 8] [--proxy-args "--workers 1"]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.kube.kit import Api, KubeEnv, Serving, drop_namespace, start_proxy, wait_for, with_query

NS = "reference-event-latency"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--proxy-args", default="", help="more flags for watchcache serve, e.g. '--workers 1'")
    args = parser.parse_args(argv)
    try:
        kube = KubeEnv.from_environ()
    except BaseException as e:  # pytest.skip outside pytest
        print(f"cannot run: {e}", file=sys.stderr)
        return 2
    api = Api(kube.url, kube.token, kube.ca)
    drop_namespace(api, NS, ("configmaps",))
    api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    with tempfile.TemporaryDirectory(prefix="reference-latency-") as tmp:
        serving = Serving.make(Path(tmp))
        proxy = start_proxy(kube, serving, *args.proxy_args.split(), resources="configmaps")
        try:
            arrivals = measure(api, Api(proxy.url, kube.token, str(serving.ca.crt)), args.writes, args.writers)
        finally:
            proxy.stop()
            drop_namespace(api, NS, ("configmaps",))
    created, direct, through = arrivals
    both = [n for n in created if n in direct and n in through]
    print(f"{len(both)} of {len(created)} events seen on both watches")
    print("after the create returned, direct:  " + _q([direct[n] - created[n] for n in both]))
    print("after the create returned, proxy:   " + _q([through[n] - created[n] for n in both]))
    print("proxy minus direct, per event:      " + _q([through[n] - direct[n] for n in both]))
    return 0


def measure(
    api: Api, proxy: Api, writes: int, writers: int
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    path = f"/api/v1/namespaces/{NS}/configmaps"
    rv = api.get(path, limit=1)["metadata"]["resourceVersion"]
    seen: dict[str, dict[str, float]] = {"direct": {}, "proxy": {}}
    opened: list[str] = []

    def watch(name: str, server: Api) -> None:
        conn = server.connect(120)
        conn.request("GET", with_query(path, watch=1, resourceVersion=rv, timeoutSeconds=90), headers=server.headers())
        resp = conn.getresponse()
        opened.append(name)
        while len(seen[name]) < writes:
            line = resp.readline()
            if not line:
                return
            event = json.loads(line)
            if event["type"] == "ADDED":
                seen[name][event["object"]["metadata"]["name"]] = time.monotonic()
        conn.close()

    threads = [threading.Thread(target=watch, args=a, daemon=True) for a in (("direct", api), ("proxy", proxy))]
    for t in threads:
        t.start()
    wait_for(lambda: len(opened) == 2, 30, "both watches open")
    created: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"latency-{i}"
        api.create(path, {"metadata": {"name": name}})
        created[name] = time.monotonic()

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(create, range(writes)))
    for t in threads:
        t.join(60)
    return created, seen["direct"], seen["proxy"]


def _q(seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    return f"p50 {statistics.median(ms):.1f} ms, p90 {ms[int(len(ms) * 0.9)]:.1f} ms, max {ms[-1]:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())

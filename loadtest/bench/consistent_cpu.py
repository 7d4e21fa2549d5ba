"""What a consistent read costs in CPU: the proxy's and kube-apiserver's, per GET and per LIST.

``consistent_reads`` measures latency in a busy cluster; this measures where the CPU goes, which is what
a passed-through read adds to its client's wait on a quiet machine. Phases of ``--reads`` sequential
reads on one keep-alive connection each, in this order, twice (so drifts of the machine fall on both):

* ``get-direct``, ``get-proxy`` (a consistent GET: passed through), ``get-cached`` (``resourceVersion=0``);
* ``list-direct``, ``list-proof`` (the proxy's proof of a consistent LIST, a protobuf metadata LIST,
  sent directly), ``list-proxy`` (proof + the cache's answer), ``list-cached`` (``resourceVersion=0``).

For each: p50/p99 ms, the proxy's CPU (every process) and kube-apiserver's per read (its CPU includes its
background work: compare phases, not absolutes). The proxy runs in the production configuration (TLS,
delegated authentication) with ``--workers`` (default 1: one process, no worker hop to count).

Run (needs the kit: ``eval "$(/work/shared/tools/kube-reference/env.sh)"``):
``.venv/bin/python -m loadtest.bench.consistent_cpu [--reads 1000]``. The last line is ``BENCH {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from loadtest.bench import lib as bl
from loadtest.bench.consistent_reads import NS, Client, seed
from loadtest.bench.kubecluster import kube_upstream, start_proxy
from watchcache.kubeproto.wire import METADATA_LIST_PROTOBUF


async def run(args: argparse.Namespace) -> dict[str, Any]:
    up = kube_upstream()
    prod = bl.Production(tls=True, authentication="delegated", workers=args.workers)
    files = bl.ProductionFiles(prod.delegated, prod.tls)
    admin = Client(up.url, up.token, up.ca)
    await seed(admin, args.configmaps, 0, 0)
    proxy = start_proxy(up, files, prod, ["--resources", "configmaps"])
    via = Client(proxy.url, up.token, "")
    get = f"/api/v1/namespaces/{NS}/configmaps/cm-00000"
    lst = f"/api/v1/namespaces/{NS}/configmaps"
    phases = [
        ("get-direct", admin, get, ""),
        ("get-proxy", via, get, ""),
        ("get-cached", via, get + "?resourceVersion=0", ""),
        ("list-direct", admin, lst, ""),
        ("list-proof", admin, lst, METADATA_LIST_PROTOBUF),
        ("list-proxy", via, lst, ""),
        ("list-cached", via, lst + "?resourceVersion=0", ""),
    ]
    samples: dict[str, list[float]] = {name: [] for name, *_ in phases}
    cpu: dict[str, list[float]] = {name: [0.0, 0.0] for name, *_ in phases}
    try:
        for _, client, path, accept in phases * 10:  # connections, reviews and caches warm
            await client.timed(path, accept)
        for _ in range(2):
            for name, client, path, accept in phases:
                p0, a0 = proxy.cpu(), up.cpu()["kube-apiserver"]
                for _ in range(args.reads):
                    samples[name].append(await client.timed(path, accept))
                cpu[name][0] += proxy.cpu() - p0
                cpu[name][1] += up.cpu()["kube-apiserver"] - a0
                bl.log(f"{name}: {bl.summarize(samples[name][-args.reads :])}")
    finally:
        await admin.close()
        await via.close()
        proxy.stop()
        files.cleanup()
    rows: dict[str, Any] = {}
    for name in samples:
        n = len(samples[name])
        rows[name] = {
            **bl.summarize(samples[name]),
            "proxy_us": round(cpu[name][0] / n * 1e6, 1),
            "apiserver_us": round(cpu[name][1] / n * 1e6, 1),
        }
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=1000, help="sequential reads per phase and round")
    p.add_argument("--configmaps", type=int, default=200)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    info = bl.machine_info()
    rows = asyncio.run(run(args))
    bl.print_table(
        ["read", "p50 ms", "p99 ms", "proxy µs CPU", "apiserver µs CPU"],
        [[k, r["p50"], r["p99"], r["proxy_us"], r["apiserver_us"]] for k, r in rows.items()],
        title=f"CPU per consistent read ({args.configmaps} ConfigMaps of ~1 KB; proxy: TLS, delegated authentication, "
        f"{args.workers} worker)",
    )
    bl.bench_line("consistent_cpu", {"reads": rows, "machine": info})


if __name__ == "__main__":
    main()

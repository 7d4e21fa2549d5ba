"""Relist storm: N client-go reflectors LIST and WATCH at once, through the proxy and straight at its upstream.

What happens after a network partition, an upstream restart or a proxy rollout: every informer
of the cluster lists and watches again, at the same moment. For each N (``--informers``) and
each target, in one run:

* ``proxy``: ``watchcache serve`` already synced (a partition healed, the upstream restarted);
* ``proxy-cold``: the proxy starts at the moment the storm does (a rollout: the clients retry
  until it answers);
* ``upstream``: kube-apiserver of the reference kit (or the simulated cluster, ``--upstream sim``).

Each reflector (``loadtest.bench.reflectors``, ``--client-procs`` processes) LISTs the pods of one
namespace holding ``--pods`` pods (``resourceVersion=0&limit=500``, following ``continue``),
then WATCHes from the list's resourceVersion, asking for protobuf as client-go's informers do.
Reported per target: the time until every reflector has listed (client-go's ``HasSynced``) and
until every watch is open, the server's peak RSS (sampled every 50 ms) over its RSS before, its
CPU over the storm, the failed requests by status (429s included), and for the proxy the
requests that reached the upstream during the storm, counted by a relay between them
(``loadtest.bench.upstream_relay``: LISTs, watches, reviews, other).

The proxy runs in the production configuration (TLS, delegated authentication, ``--workers 1``)
with the product's defaults otherwise (``--proxy-args`` adds flags).

Run: ``.venv/bin/python -m loadtest.bench.relist --quick``, or e.g. ``--informers 500,2000
--pods 10000`` (the issue's points).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import threading
import time
from typing import Any

from harness.processes import free_port
from loadtest.bench import kubecluster as kc
from loadtest.bench import lib as bl
from loadtest.bench.kubeclient import ACCEPT_PROTOBUF, Collect, Target
from loadtest.bench.kubelets import loadavg, split


async def warm_protobuf(url: str, token: str, path: str) -> None:
    """A warm proxy has its protobuf cache of pods too (or knows its upstream refuses protobuf): one
    typed read starts it, and its LIST of the upstream is made before the storm, not during it."""
    conn = await Target(url, token).connect()
    try:
        sink = Collect()
        conn.request("GET", path + "?resourceVersion=0&limit=1", sink, accept=ACCEPT_PROTOBUF)
        await sink.done
    finally:
        conn.close()
    await asyncio.sleep(1.0)


class RssSampler:
    """Peak RSS of a set of processes, sampled in a thread (the storm must not wait for it)."""

    def __init__(self, pids: list[int], period: float = 0.05) -> None:
        self.pids = list(pids)
        self.period = period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, pid: int) -> None:
        self.pids.append(pid)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for pid in list(self.pids):
                with contextlib.suppress(OSError):
                    total += bl.tree_rss_bytes(pid)
            self.peak = max(self.peak, total)
            self._stop.wait(self.period)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def storm(
    args: argparse.Namespace,
    up: kc.Upstream,
    layout: kc.Layout,
    files: bl.ProductionFiles,
    relay: bl.Helper | None,
    relay_url: str,
    n: int,
    target: str,
) -> dict[str, Any]:
    prod = bl.Production(tls=True, authentication=args.authentication, workers=args.workers)
    extra = shlex.split(args.proxy_args) + (["--http2"] if args.h2 else [])
    proxy: bl.Proc | None = None
    cold = target == "proxy-cold"
    port = 0
    if target == "proxy":
        proxy = kc.start_proxy(up, files, prod, extra, via=relay_url)
        url = proxy.url
        if args.accept == "protobuf":
            await warm_protobuf(url, up.token, f"/api/v1/namespaces/{layout.relist_namespace}/pods")
    elif cold:
        port = free_port()
        url = f"https://127.0.0.1:{port}"
    else:
        url = up.url
    path = f"/api/v1/namespaces/{layout.relist_namespace}/pods"
    helpers: list[bl.Helper] = []
    row: dict[str, Any] = {"N": n, "target": target, "pods": layout.relist_pods}
    try:
        for lo, hi in split(0, n, args.client_procs):
            helpers.append(
                await bl.Helper.start(
                    "reflectors",
                    "--target",
                    url,
                    "--token",
                    up.token,
                    "--ca",
                    up.ca if target == "upstream" else "",
                    "--accept",
                    args.accept,
                    "--path",
                    path,
                    "--count",
                    str(hi - lo),
                    *(["--h2"] if args.h2 else []),
                )
            )
        for h in helpers:
            await h.recv()
        await asyncio.sleep(args.settle)
        server_pids = [proxy.pid] if proxy is not None else ([] if cold else [up.pids[up.server]])
        rss0 = sum(bl.tree_rss_bytes(p) for p in server_pids) if server_pids else 0
        counts0 = await relay.ask("counts") if relay is not None else {}
        cpu_up0 = up.cpu()
        cpu0 = proxy.cpu() if proxy is not None else 0.0
        at = time.time() + 1.0
        t0 = time.monotonic() + 1.0
        m0 = bl.machine_busy()[0]
        with RssSampler(server_pids) as sampler:
            for h in helpers:
                await h.send("go", at=at, deadline=args.deadline)
            if cold:
                await asyncio.sleep(max(0.0, at - time.time()))
                proxy = await asyncio.to_thread(
                    kc.start_proxy, up, files, prod, extra, wait=False, via=relay_url, listen=f"127.0.0.1:{port}"
                )
                sampler.add(proxy.pid)
            results = [await h.recv(args.deadline + 120) for h in helpers]
            elapsed = time.monotonic() - t0
            wall = elapsed + 1.0
        m1 = bl.machine_busy()[0]
        cpu_up1 = up.cpu()
        cpu1 = proxy.cpu() if proxy is not None else 0.0
        counts1 = await relay.ask("counts") if relay is not None else {}
        await asyncio.sleep(args.settle)
        # What the server keeps once the storm is over and every reflector is watching.
        rss_after = sum(bl.tree_rss_bytes(p) for p in ([proxy.pid] if proxy is not None else server_pids))
        listed = [x for r in results for x in r["listed"]]
        watching = [x for r in results for x in r["watching"]]
        failures: dict[str, int] = {}
        for r in results:
            for k, v in r["failures"].items():
                failures[k] = failures.get(k, 0) + v
        done_listed = sorted(x for x in listed if x is not None)
        done_watching = sorted(x for x in watching if x is not None)
        upstream_requests = {k: v - counts0.get(k, 0) for k, v in counts1.items() if v - counts0.get(k, 0)}
        verbs: dict[str, int] = {}
        for k, v in upstream_requests.items():
            verbs[k.split()[0]] = verbs.get(k.split()[0], 0) + v
        server_cpu = (cpu1 - cpu0) if proxy is not None else cpu_up1.get(up.server, 0) - cpu_up0.get(up.server, 0)
        row.update(
            {
                "listed": len(done_listed),
                "watching": len(done_watching),
                "all_listed_s": round(done_listed[-1], 2) if len(done_listed) == n else None,
                "p50_listed_s": round(bl.percentile(done_listed, 50), 2) if done_listed else None,
                "all_watching_s": round(done_watching[-1], 2) if len(done_watching) == n else None,
                "requests": sum(r["requests"] for r in results),
                "pages": sum(r["pages"] for r in results),
                "gb_received": round(sum(r["bytes"] for r in results) / 1e9, 2),
                "failed_requests": failures,
                "rss_before_mb": round(rss0 / 2**20, 1),
                "rss_peak_mb": round(sampler.peak / 2**20, 1),
                "rss_after_mb": round(rss_after / 2**20, 1),
                "server_cpu_s": round(server_cpu, 2),
                "upstream_cpu_s": {k: round(cpu_up1[k] - cpu_up0.get(k, 0), 2) for k in cpu_up1},
                "client_cpu_s": round(sum(r["cpu"] for r in results), 2),
                "machine_busy_cores": round((m1 - m0) / wall, 2),
                "upstream_requests": upstream_requests,
                "upstream_lists": sum(v for k, v in upstream_requests.items() if k.startswith("list ")),
                "upstream_by_verb": verbs,
                "upstream_lists_max_per_resource": max(
                    (v for k, v in upstream_requests.items() if k.startswith("list ")), default=0
                ),
                "seconds": round(elapsed, 2),
                "loadavg": loadavg(),
                "rvs": sorted({rv for r in results for rv in r["rvs"]})[:5],
            }
        )
        bl.log(
            f"N={n} {target}: listed {row['listed']}/{n} (all by {row['all_listed_s']} s), watching "
            f"{row['watching']}, peak RSS {row['rss_peak_mb']} MB (before {row['rss_before_mb']}), CPU "
            f"{row['server_cpu_s']} s, failed {failures or 'none'}, upstream {verbs or '-'}, "
            f"load {loadavg()}"
        )
        return row
    finally:
        for h in helpers:
            await h.close()
        if proxy is not None:
            proxy.stop()


def report(rows: list[dict[str, Any]], up: kc.Upstream) -> dict[str, Any]:
    bl.print_table(
        [
            "N",
            "target",
            "pods",
            "listed",
            "all listed s",
            "p50 listed s",
            "all watching s",
            "requests",
            "GB received",
            "failed requests",
            "RSS before MB",
            "RSS peak MB",
            "RSS after MB",
            "server CPU s",
            f"{up.server} CPU s",
            "upstream requests",
            "machine busy",
            "load",
        ],
        [
            [
                r["N"],
                r["target"],
                r["pods"],
                r["listed"],
                r["all_listed_s"],
                r["p50_listed_s"],
                r["all_watching_s"],
                r["requests"],
                r["gb_received"],
                " ".join(f"{k}:{v}" for k, v in r["failed_requests"].items()) or "-",
                r["rss_before_mb"],
                r["rss_peak_mb"],
                r["rss_after_mb"],
                r["server_cpu_s"],
                r["upstream_cpu_s"].get(up.server),
                " ".join(f"{k}:{v}" for k, v in r["upstream_by_verb"].items()) or "-",
                r["machine_busy_cores"],
                r["loadavg"],
            ]
            for r in rows
        ],
        title="\nRelist storm",
    )
    summary: dict[str, Any] = {}
    by = {(r["N"], r["target"]): r for r in rows}
    for (n, target), r in by.items():
        direct = by.get((n, "upstream"))
        if target.startswith("proxy") and direct and r["all_listed_s"] and direct["all_listed_s"]:
            summary[f"N={n} {target} time vs upstream"] = round(r["all_listed_s"] / direct["all_listed_s"], 2)
        if target.startswith("proxy"):
            summary[f"N={n} {target} upstream LISTs"] = r["upstream_lists"]
            summary[f"N={n} {target} upstream LISTs per resource (max)"] = r["upstream_lists_max_per_resource"]
    print("\nSummary:", summary, flush=True)
    return summary


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    files = bl.ProductionFiles(any_delegated=args.upstream == "sim", any_tls=True)
    up = kc.kube_upstream() if args.upstream == "kube" else kc.sim_upstream(files)
    layout = kc.Layout(prefix=args.prefix, relist_pods=args.pods)
    relay: bl.Helper | None = None
    rows: list[dict[str, Any]] = []
    try:
        bl.log(f"seeding {layout} on {up.kind} at {up.url}")
        bl.log(f"seeded: {await kc.seed(up, layout)}")
        relay_url = ""
        if any(t.startswith("proxy") for t in args.target_list) and not args.no_relay:
            relay = await bl.Helper.start("upstream-relay", "--upstream", up.url, "--ca", up.ca)
            relay_url = (await relay.recv())["url"]
        for n in args.informer_list:
            for target in args.target_list:
                rows.append(await storm(args, up, layout, files, relay, relay_url, n, target))
        summary = report(rows, up)
        bl.bench_line(
            "relist",
            {
                "machine": info,
                "upstream": up.kind,
                "args": {k: v for k, v in vars(args).items() if not k.endswith("_list")},
                "summary": summary,
                "rows": rows,
                "loadavg_at_end": loadavg(),
            },
        )
    finally:
        if relay is not None:
            await relay.close()
        if not args.keep and up.kind == "kube":  # the sim goes with its objects
            bl.log(f"cleanup: {await kc.cleanup(up, layout)}")
        up.stop()
        files.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kit = os.environ.get("KUBE_REFERENCE_URL")
    p.add_argument("--upstream", choices=("kube", "sim"), default="kube" if kit else "sim")
    p.add_argument("--quick", action="store_true", help="N=20,50 against 1,000 pods")
    p.add_argument("--informers", default="500,2000", help="N values (comma-separated)")
    p.add_argument("--pods", type=int, default=10000)
    p.add_argument("--targets", default="proxy,proxy-cold,upstream")
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--deadline", type=float, default=600.0, help="seconds a storm may last")
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--h2", action="store_true", help="HTTP/2 (the proxy gets --http2)")
    p.add_argument("--accept", choices=("protobuf", "json"), default="protobuf")
    p.add_argument("--authentication", choices=bl.AUTH_MODES, default="delegated")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--proxy-args", default="")
    p.add_argument("--no-relay", action="store_true", help="connect the proxy to the upstream directly")
    p.add_argument("--prefix", default="i25")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.informers, args.pods = "20,50", 1000
    args.informer_list = [int(x) for x in args.informers.split(",")]
    args.target_list = args.targets.split(",")
    bl.raise_nofile()
    import uvloop

    uvloop.run(amain(args))


if __name__ == "__main__":
    main()

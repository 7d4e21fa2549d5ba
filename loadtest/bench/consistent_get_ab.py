"""A consistent GET through the proxies of two trees side by side: which is faster, measured in one run.

``consistent_reads`` runs one tree at a time, and this machine's speed drifts between runs by more than a
change to the passed-through GET moves it (kube-apiserver's own CPU per GET was seen to double from one
minute to the next: docs/performance.md). Here a proxy of each tree (``--a`` and ``--b``: directories
holding a copy of ``watchcache``, as ``WATCHCACHE_BENCH_SRC``; "" for this work tree) runs on the kit at
the same time, in the production configuration (TLS, delegated authentication, default workers), and each
round GETs one ConfigMap without a resourceVersion directly and through each proxy, in a random order with
random pauses, on a keep-alive connection each, while a writer renews Leases of another namespace at each
of ``--rates`` writes/s. Both proxies see the same machine, the same kube-apiserver and the same writes.
``--lists N`` adds N clients LISTing the ConfigMaps directly (consistent LISTs, one after another) through
each rate's rounds: kube-apiserver as loaded as in ``consistent_reads``' rounds, whose LISTs saturate the
two cores at 500 writes/s (a direct GET's p50 there is ~10 ms, ~3 ms here without them).

Prints, per rate, direct p50/p99 and each proxy's p50/p99 over direct, and which tree each proxy ran.

Run (needs the kit: ``eval "$(/work/shared/tools/kube-reference/env.sh)"``), e.g. a worktree of the
commit before a change against this tree:
``.venv/bin/python -m loadtest.bench.consistent_get_ab --a ../old --b "" --rates 0,10,50,500 --rounds 1000``.
The last line is ``BENCH {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
from typing import Any

from loadtest.bench import lib as bl
from loadtest.bench.consistent_reads import LEASE_NS, NS, Client, seed
from loadtest.bench.kubecluster import kube_upstream, start_proxy


def tree(src: str) -> str:
    """Which code a proxy ran: the tree's directory and its commit, where git can tell, marked
    "+changes" when the tree's ``watchcache`` differs from that commit (a run of uncommitted code)."""
    where = src or str(bl.ROOT)
    try:
        head = subprocess.run(
            ["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        changed = (
            head
            and subprocess.run(
                ["git", "-C", where, "status", "--porcelain", "--", "watchcache"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        head = changed = ""
    return f"{where} ({head + ' +changes' if changed else head or 'no git'})"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    up = kube_upstream()
    prod = bl.Production(tls=True, authentication="delegated")
    files = bl.ProductionFiles(prod.delegated, prod.tls)
    admin = Client(up.url, up.token, up.ca)
    await seed(admin, 200, args.leases, 0)
    procs: list[bl.Proc] = []
    clients: list[Client] = [admin]
    writer: bl.Helper | None = None
    results: dict[str, Any] = {}
    try:
        for src in (args.a, args.b):
            procs.append(start_proxy(up, files, prod, ["--resources", "configmaps"], src=src))
        targets = {"direct": Client(up.url, up.token, up.ca)}
        targets |= {name: Client(p.url, up.token, "") for name, p in zip(("a", "b"), procs, strict=True)}
        clients += targets.values()
        writer = await bl.Helper.start(
            "busy-writer", "--target", up.url, "--token", up.token, "--ca", up.ca, "--kind", "leases",
            "--namespace", LEASE_NS, "--objects", str(args.leases),
        )  # fmt: skip
        await writer.recv(60)  # ready
        get = f"/api/v1/namespaces/{NS}/configmaps/cm-00000"
        for _ in range(30):  # connections, reviews, pooled upstream connections
            for client in targets.values():
                await client.timed(get)
        listers = [Client(up.url, up.token, up.ca) for _ in range(args.lists)]
        clients += listers
        for rate in args.rates:
            await writer.ask("start", rate=rate)
            stop = asyncio.Event()
            load = [asyncio.create_task(_list_until(c, f"/api/v1/namespaces/{NS}/configmaps", stop)) for c in listers]
            await asyncio.sleep(1.0)
            times: dict[str, list[float]] = {name: [] for name in targets}
            order = list(targets.items())
            for _ in range(args.rounds):
                random.shuffle(order)
                for name, client in order:
                    times[name].append(await client.timed(get))
                    await asyncio.sleep(random.uniform(0, args.pause / 1000))
            stop.set()
            lists = sum(await asyncio.gather(*load))
            wrote = await writer.ask("stop")
            results[str(rate)] = {name: bl.summarize(t) for name, t in times.items()}
            results[str(rate)]["writes_per_s"] = wrote["rate"]
            results[str(rate)]["background_lists"] = lists
    finally:
        if writer is not None:
            await writer.close()
        for client in clients:
            await client.close()
        for proc in procs:
            proc.stop()
        files.cleanup()
    return results


async def _list_until(client: Client, path: str, stop: asyncio.Event) -> int:
    """Consistent LISTs of ``path``, one after another, until ``stop``: how many."""
    n = 0
    while not stop.is_set():
        await client.timed(path)
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help='a copy of watchcache for proxy A ("" for this work tree)')
    p.add_argument("--b", required=True, help='a copy of watchcache for proxy B ("" for this work tree)')
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 10.0, 50.0, 500.0])
    p.add_argument("--rounds", type=int, default=1000, help="GETs per target and rate")
    p.add_argument("--leases", type=int, default=100, help="Leases the writer renews in turn")
    p.add_argument("--pause", type=float, default=4.0, help="the longest pause between two GETs, ms (random)")
    p.add_argument("--lists", type=int, default=0, help="clients LISTing the ConfigMaps directly meanwhile")
    args = p.parse_args()
    info = bl.machine_info()
    trees = {"a": tree(args.a), "b": tree(args.b)}
    results = asyncio.run(run(args))
    rows = []
    for rate, r in results.items():
        d = r["direct"]
        rows.append([rate, r["writes_per_s"], d["p50"], d["p99"],
                     round(r["a"]["p50"] - d["p50"], 2), round(r["a"]["p99"] - d["p99"], 2),
                     round(r["b"]["p50"] - d["p50"], 2), round(r["b"]["p99"] - d["p99"], 2)])  # fmt: skip
    bl.print_table(
        ["rate", "writes/s", "direct p50", "direct p99", "A p50 over", "A p99 over", "B p50 over", "B p99 over"],
        rows,
        title=f"consistent GET, {args.rounds} rounds per rate (ms); A: {trees['a']}; B: {trees['b']}",
    )
    bl.bench_line("consistent_get_ab", {"rates": results, "trees": trees, "machine": info})


if __name__ == "__main__":
    main()

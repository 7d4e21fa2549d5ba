"""Memory of the proxy per cached object, against the JSON bytes it holds.

For N pods (~3 KB each): start ``watchcache sim --objects N``, the proxy in front of it,
wait for ``/readyz`` and for N pods in ``/debug/cache``, let it settle, and read the proxy's
VmRSS (summed over its processes) from ``/proc/PID/status``. Subtract a baseline proxy in
front of a sim with no pods, in the same run; divide by N and by the JSON bytes the cache
holds (``/debug/cache`` ``object_bytes``, summed over resources).

Rows: the proxy with ``--workers 1`` (the cost of one cache), and with the default worker
count (every worker that serves pods holds a replica of the cache).

Also, in-process (``--structure``): the Python heap retained per object by the cache's own
structures (``encode_object`` + the sorted index), measured with tracemalloc on the sim's
pods, which tells the structural overhead apart from allocator effects in RSS.

The production configuration (``--tls``, ``--authentication delegated``, ``--workers N``; ``--production``)
applies to both rows (``--workers N`` replaces the default-workers row); with delegated authentication the
sim enforces ``watchcache/sim/policy-example.yaml`` and every request carries a token.

Run: ``.venv/bin/python -m loadtest.bench.memory --quick`` (20,000 pods) or without (100,000).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from typing import Any

from loadtest.bench import lib as bl


def settle_rss(proc: bl.Proc, seconds: float) -> dict[str, int]:
    """RSS after ``seconds`` of quiet (the minimum of a few readings), summed over the process tree."""
    time.sleep(seconds)
    best: dict[str, int] | None = None
    for _ in range(5):
        fields: dict[str, int] = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "VmHWM": 0}
        for pid in proc.pids():
            try:
                for k, v in bl.status_fields(pid).items():
                    fields[k] += v
            except (OSError, KeyError):
                continue
        if best is None or fields["VmRSS"] < best["VmRSS"]:
            best = fields
        time.sleep(0.2)
    assert best is not None
    return best


def cache_bytes(proc: bl.Proc) -> dict[str, int]:
    stats = bl.get_json(proc.url + "/debug/cache")["resources"]
    return {
        "objects": sum(s["objects"] for s in stats.values()),
        "object_bytes": sum(s["object_bytes"] for s in stats.values()),
        "history_bytes": sum(s["history_bytes"] for s in stats.values()),
        "pods": stats.get("pods", {}).get("objects", 0),
        "pod_bytes": stats.get("pods", {}).get("object_bytes", 0),
    }


def measure_proxy(sim: bl.Proc, n: int, flags: list[str], settle: float) -> tuple[dict[str, int], dict[str, int]]:
    proxy = bl.start_proxy(sim.url, extra=flags)
    try:
        if n:
            bl.wait_objects(proxy, "pods", n)
        # A sharded proxy: make every worker serve pods once (a follower replicates on first use).
        for _ in range(20):
            bl.http("GET", proxy.url + "/api/v1/pods?limit=1&resourceVersion=0")
        rss = settle_rss(proxy, settle)
        cache = cache_bytes(proxy)
        rss["processes"] = len(proxy.pids())
        return rss, cache
    finally:
        proxy.stop()


def structure(n: int) -> dict[str, Any]:
    """tracemalloc: heap retained by CachedObjects + the SortedDict index for ``n`` pods."""
    import gc
    import tracemalloc

    import orjson
    from sortedcontainers import SortedDict

    from watchcache.cache.object import encode_object
    from watchcache.resources import ResourceRegistry
    from watchcache.sim.churn import populate
    from watchcache.sim.cluster import SimCluster

    cluster = SimCluster(ResourceRegistry())
    populate(cluster, objects=n, namespaces=10)
    pods = cluster.registry.get("", "v1", "pods")
    assert pods is not None
    wire = [b"{" + o.body for o in cluster.cachers[pods].cache.snapshot().iter_range("", None)]
    del cluster
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    items = [orjson.loads(b) for b in wire]  # what a reflector's LIST page decodes to
    objects = [encode_object(pods, item) for item in items]
    index = SortedDict((o.key, o) for o in objects)
    del items  # freed, except what the cached objects keep (their labels dicts)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    body = sum(len(o.body) for o in objects)
    retained = after - before
    tracemalloc.stop()
    per = retained / len(objects)
    return {
        "objects": len(objects),
        "body_bytes_per_object": round(body / len(objects)),
        "heap_bytes_per_object": round(per),
        "heap_over_body": round(per / (body / len(objects)), 3),
        "index_entries": len(index),
    }


def run_structure(n: int) -> dict[str, Any]:
    env, cwd = bl.child_env()
    out = subprocess.run(
        bl.python_m("loadtest.bench.memory", "--structure-only", str(n)),
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    if out.returncode != 0:
        return {"error": out.stderr[-500:]}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20,000 pods (< 60 s)")
    p.add_argument("--objects", type=int, help="pods (default 100,000; quick 20,000)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before reading RSS")
    p.add_argument("--no-default-workers", action="store_true", help="skip the default-workers row")
    p.add_argument("--structure-only", type=int, help=argparse.SUPPRESS)
    bl.add_production_flags(p)
    args = p.parse_args()
    prod = bl.production_from_args(args)
    if args.structure_only:
        print(json.dumps(structure(args.structure_only)))
        return
    n = args.objects or (20000 if args.quick else 100000)
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    t0 = time.monotonic()
    files = bl.ProductionFiles(prod.delegated, prod.tls)
    one = prod.but(workers=1)
    configs = [("--workers 1", files.proxy_flags(one), one)]
    if not args.no_default_workers and prod.workers != 1:
        configs.append(
            (f"--workers {prod.workers}" if prod.workers else "default workers", files.proxy_flags(prod), prod)
        )
    rows = []
    results: list[dict[str, Any]] = []
    sim0 = sim = None
    try:
        bl.log("baseline: sim with 0 pods")
        sim0 = bl.start_sim(objects=0, namespaces=10, extra=files.sim_flags())
        bl.wait_ready(sim0)
        base = {name: measure_proxy(sim0, 0, flags, args.settle) for name, flags, _ in configs}
        sim0.stop()
        sim0 = None
        bl.log(f"sim with {n} pods")
        t_sim = time.monotonic()
        sim = bl.start_sim(objects=n, namespaces=10, extra=files.sim_flags())
        bl.wait_ready(sim, 600)
        sim_start_s = time.monotonic() - t_sim
        sim_rss = settle_rss(sim, 1.0)
        for name, flags, cfg in configs:
            t_sync = time.monotonic()
            rss, cache = measure_proxy(sim, n, flags, args.settle)
            b_rss, b_cache = base[name]
            delta = rss["VmRSS"] - b_rss["VmRSS"]
            anon = rss["RssAnon"] - b_rss["RssAnon"]
            held = cache["object_bytes"] - b_cache["object_bytes"]
            r = {
                "config": name,
                "production": cfg.label,
                "pods": n,
                "processes": rss["processes"],
                "baseline_rss": b_rss["VmRSS"],
                "rss": rss["VmRSS"],
                "rss_anon": rss["RssAnon"],
                "peak_rss_sum": rss["VmHWM"],
                "rss_delta": delta,
                "anon_delta": anon,
                "json_bytes_held": held,
                "pod_json_bytes": cache["pod_bytes"],
                "rss_per_object": round(delta / n),
                "json_per_object": round(held / n),
                "rss_over_json": round(delta / held, 3) if held else None,
                "anon_over_json": round(anon / held, 3) if held else None,
                "peak_over_json": round((rss["VmHWM"] - b_rss["VmHWM"]) / held, 3) if held else None,
                "seconds_to_sync_and_settle": round(time.monotonic() - t_sync, 1),
            }
            results.append(r)
            rows.append(
                [
                    cfg.label,
                    n,
                    r["processes"],
                    b_rss["VmRSS"] / 1e6,
                    rss["VmRSS"] / 1e6,
                    delta / 1e6,
                    held / 1e6,
                    r["rss_per_object"],
                    r["json_per_object"],
                    r["rss_over_json"],
                    r["anon_over_json"],
                    r["peak_over_json"],
                ]
            )
    finally:
        bl.stop_all([sim0, sim])
        files.cleanup()
    bl.log("in-process structure estimate (tracemalloc)")
    struct = run_structure(min(n, 20000))
    print()
    bl.print_table(
        [
            "proxy",
            "pods",
            "procs",
            "baseline MB",
            "RSS MB",
            "delta MB",
            "JSON held MB",
            "RSS B/obj",
            "JSON B/obj",
            "RSS/JSON",
            "anon/JSON",
            "peak/JSON",
        ],
        rows,
        title="Proxy memory per cached pod (VmRSS summed over the proxy's processes, minus a 0-pod baseline)",
    )
    print(
        f"sim (upstream) RSS with {n} pods: {sim_rss['VmRSS'] / 1e6:.0f} MB (started in {sim_start_s:.1f}s); "
        f"in-process structure: {struct}"
    )
    goal_row = next((r for r in results if r["config"] == "--workers 1"), None)
    goals = {}
    if goal_row and goal_row["rss_over_json"] is not None:
        goals["rss_over_json_bytes"] = {
            "goal": "<= 2.0",
            "measured": goal_row["rss_over_json"],
            "met": goal_row["rss_over_json"] <= 2.0,
        }
        print(
            f"goal rss_over_json_bytes (--workers 1): <= 2.0  measured {goal_row['rss_over_json']}  "
            f"{'MET' if goal_row['rss_over_json'] <= 2.0 else 'NOT MET'}"
        )
    bl.bench_line(
        "memory",
        {
            "mode": "quick" if args.quick else "full",
            "machine": info,
            "seconds": round(time.monotonic() - t0, 1),
            "goals": goals,
            "results": results,
            "sim_rss": sim_rss["VmRSS"],
            "structure": struct,
        },
    )


if __name__ == "__main__":
    main()

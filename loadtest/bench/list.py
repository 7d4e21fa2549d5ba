"""LIST throughput through the proxy vs a raw ceiling serving the same bytes.

For each pod count N (sim with N ~3 KB pods, no churn; the proxy in front, synced):

* ``full``: ``GET /api/v1/pods?resourceVersion=0`` (the whole list from the cache);
* ``paged``: ``?limit=500&resourceVersion=0`` then ``?limit=500&continue=TOKEN`` until the last page
  (one request = one page; a "list" = all pages);
* ``consistent`` (full mode only): ``GET /api/v1/pods`` with no resourceVersion: the proxy must prove
  freshness against the upstream first (docs/consistency.md).

Targets, measured back to back with the same client (``python -m loadtest.bench.list_client``: C keep-alive
connections in a separate process, each issuing requests back to back):

* ``ceiling``: a bare uvloop server answering the same paths with ``writelines`` of the same
  pre-encoded per-item bytes (fetched from the proxy once);
* ``proxy``: ``watchcache serve --upstream SIM``;
* ``sim``: the upstream itself (the same read path, no proxy hop).

The production configuration (``--tls``, ``--authentication delegated``, ``--workers N``; ``--production``
= TLS + delegated + default workers) applies to ``proxy``, and adds, in the same run:

* ``ceiling-tls`` (with ``--tls``): the raw server on TLS with the proxy's certificate, its per-item
  buffers pre-joined into 64 KB writes (full TLS records, one ``SSL_write`` each: the best a bare
  server does; ``--ceiling-no-join`` mirrors the plain ceiling's ``writelines`` instead);
* ``proxy-http`` (with ``--tls``): the proxy on plain HTTP without authentication.

With delegated authentication the sim enforces ``watchcache/sim/policy-example.yaml`` and the LISTs
carry ``alice-token``. Each proxy target is compared with the ceiling of its own transport.

Run: ``.venv/bin/python -m loadtest.bench.list --quick`` (< 60 s) or without ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from loadtest.bench import lib as bl

FULL = "/api/v1/pods?resourceVersion=0"
CONSISTENT = "/api/v1/pods"
FIRST_PAGE = "/api/v1/pods?limit={limit}&resourceVersion=0"
NEXT_PAGE = "/api/v1/pods?limit={limit}&continue="


def fetch_bodies(base: str, limit: int, workdir: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """The proxy's answers to every path the client will ask, saved for the ceiling."""
    spec: dict[str, str] = {}
    info: dict[str, Any] = {}
    body = bl.get_bytes(base + FULL)
    path = workdir / "full.json"
    path.write_bytes(body)
    spec[FULL] = spec[CONSISTENT] = str(path)
    info["full_bytes"] = len(body)
    target = FIRST_PAGE.format(limit=limit)
    pages = 0
    page_bytes = 0
    while True:
        body = bl.get_bytes(base + target)
        path = workdir / f"page-{pages}.json"
        path.write_bytes(body)
        spec[target] = str(path)
        pages += 1
        page_bytes += len(body)
        token = json.loads(body)["metadata"].get("continue")
        if not token:
            break
        target = NEXT_PAGE.format(limit=limit) + quote(token, safe="")
    info["pages"] = pages
    info["page_bytes"] = page_bytes
    return spec, info


async def warm(base: str, attempts: int = 40) -> None:
    """Every worker of a sharded proxy serves pods (a follower syncs on its first request)."""
    ok = 0
    for _ in range(attempts):
        status, _ = await asyncio.to_thread(bl.http, "GET", base + "/api/v1/pods?limit=1&resourceVersion=0")
        ok = ok + 1 if status == 200 else 0
        if ok >= 10:
            return
        await asyncio.sleep(0.1 if status == 200 else 0.5)


async def run_client(
    target: bl.Proc, cpu: bl.Proc | None, args: argparse.Namespace, mode: str, limit: int, token: str = ""
) -> dict[str, Any]:
    host, port = target.address
    client = await bl.Helper.start(
        "list-client",
        "--host",
        host,
        "--port",
        str(port),
        "--connections",
        str(args.conns),
        *(["--tls"] if target.tls else []),
        *(["--token", token] if token else []),
    )
    try:
        await client.recv(timeout=60)
        if mode == "paged":
            cmd = {"first": FIRST_PAGE.format(limit=limit), "paged": True, "page_prefix": NEXT_PAGE.format(limit=limit)}
        else:
            cmd = {"first": FULL if mode == "full" else CONSISTENT, "paged": False}
        c0 = cpu.cpu() if cpu else 0.0
        m0 = bl.machine_busy()
        res = await client.ask("run", timeout=args.duration + 600, duration=args.duration, **cmd)
        c1 = cpu.cpu() if cpu else 0.0
        m1 = bl.machine_busy()
    finally:
        await client.close()
    el = res["elapsed"]
    server_cores = (c1 - c0) / el
    return {
        "tls": target.tls,
        "requests": res["requests"],
        "lists": res["lists"],
        "elapsed": round(el, 2),
        "req_s": round(res["requests"] / el, 1),
        "lists_s": round(res["lists"] / el, 2),
        "mb_s": round(res["bytes"] / el / 1e6, 1),
        "req_ms": bl.summarize(res["req_lat"]),
        "list_ms": bl.summarize(res["list_lat"]),
        "server_cores": round(server_cores, 2),
        "ms_cpu_per_request": round(server_cores * el / res["requests"] * 1e3, 3) if res["requests"] else None,
        "client_cores": round(res["cpu"] / el, 2),
        "machine_busy_cores": round((m1[0] - m0[0]) / el, 2),
        "errors": res["errors"],
    }


async def bench_n(n: int, args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-list-"))
    procs: dict[str, bl.Proc] = {}
    prod: bl.Production = args.prod
    configs = {"proxy": prod, "proxy-http": bl.Production(workers=prod.workers)}
    configs = {k: v for k, v in configs.items() if k in args.targets}
    files = bl.ProductionFiles(
        any(c.delegated for c in configs.values()),
        "ceiling-tls" in args.targets or any(c.tls for c in configs.values()),
    )
    try:
        bl.log(f"N={n}: starting sim and {', '.join(f'{k} ({v.label})' for k, v in configs.items())}")
        sim = procs["sim"] = bl.start_sim(objects=n, namespaces=10, extra=files.sim_flags())
        bl.wait_ready(sim)
        for name, cfg in configs.items():
            procs[name] = bl.start_proxy(sim.url, extra=[*files.proxy_flags(cfg), *args.proxy_args])
        for name in configs:
            bl.wait_objects(procs[name], "pods", n)
            await warm(procs[name].url)
        source = procs[next(iter(configs))] if configs else sim
        spec, info = fetch_bodies(source.url, args.limit, workdir)
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for name, tls in (("ceiling", False), ("ceiling-tls", True)):
            if name in args.targets:
                extra = [*files.tls_args(), *(["--no-join"] if args.ceiling_no_join else [])] if tls else []
                procs[name] = bl.start_process(
                    name,
                    bl.python_m("loadtest.bench.raw_list", "--bodies", str(spec_path), *extra),
                )
        bl.log(f"N={n}: full LIST {info['full_bytes'] / 1e6:.1f} MB, {info['pages']} pages of {args.limit}")
        for mode in args.modes:
            for name in args.targets:
                target = procs[name]
                token = files.client_token if name in configs or name == "sim" else ""
                r = await run_client(target, target, args, mode, args.limit, token)
                r.update({"objects": n, "mode": mode, "target": name, **info})
                if name in configs:
                    r["config"] = configs[name].label
                results.append(r)
                bl.log(
                    f"N={n:>6} {mode:10} {name:8}: {r['req_s']:>8,.1f} req/s, p50 {r['req_ms']['p50']} ms, "
                    f"p99 {r['req_ms']['p99']} ms, {r['mb_s']:,.0f} MB/s, server {r['server_cores']} cores, "
                    f"machine busy {r['machine_busy_cores']} {r['errors'][:1]}"
                )
    finally:
        bl.stop_all(procs.values())
        files.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(r["objects"], r["mode"], r["target"]): r for r in results}
    rows = []
    for r in results:
        ceil = by.get(
            (r["objects"], r["mode"], "ceiling-tls" if r["tls"] and r["target"] != "ceiling-tls" else "ceiling")
        )
        ratio = r["req_s"] / ceil["req_s"] if ceil and ceil["req_s"] else float("nan")
        r["ratio_vs_ceiling"] = round(ratio, 3) if ratio == ratio else None
        eff = float("nan")
        if ceil and ceil["ms_cpu_per_request"] and r["ms_cpu_per_request"]:
            eff = ceil["ms_cpu_per_request"] / r["ms_cpu_per_request"]
        r["cpu_efficiency_vs_ceiling"] = round(eff, 3) if eff == eff else None
        rows.append(
            [
                r["objects"],
                r["mode"],
                r["target"],
                r["req_s"],
                r["lists_s"],
                r["req_ms"]["p50"],
                r["req_ms"]["p99"],
                r["list_ms"]["p99"] if r["mode"] == "paged" else float("nan"),
                r["mb_s"],
                ratio,
                r["server_cores"],
                r["ms_cpu_per_request"] if r["ms_cpu_per_request"] is not None else float("nan"),
                eff,
                r["client_cores"],
                r["machine_busy_cores"],
                len(r["errors"]),
            ]
        )
    print()
    bl.print_table(
        [
            "pods",
            "mode",
            "target",
            "req/s",
            "lists/s",
            "p50 ms",
            "p99 ms",
            "list p99 ms",
            "MB/s",
            "vs ceiling",
            "srv cores",
            "ms cpu/req",
            "cpu eff vs ceil",
            "client cores",
            "machine busy",
            "errors",
        ],
        rows,
        title="LIST: requests back to back on C keep-alive connections (paged: one request = one page)",
    )
    goals = {}
    for target in ("proxy", "proxy-http"):
        found = by.get((10000, "full", target))
        if found is not None and found["ratio_vs_ceiling"] is not None:
            r = found
            floor = 0.6 if r["tls"] else 0.5
            goals[f"{target}_full_list_10000_vs_{'ceiling-tls' if r['tls'] else 'ceiling'}"] = {
                "goal": f">= {floor}",
                "measured": r["ratio_vs_ceiling"],
                "cpu_efficiency_vs_ceiling": r["cpu_efficiency_vs_ceiling"],
                "met": r["ratio_vs_ceiling"] >= floor,
            }
    tls, plain = by.get((10000, "full", "proxy")), by.get((10000, "full", "proxy-http"))
    if tls and plain and tls["tls"] and tls["ms_cpu_per_request"] and plain["ms_cpu_per_request"]:
        goals["cpu_per_list_10000_proxy_vs_proxy_http"] = {
            "goal": "(reported)",
            "measured": round(tls["ms_cpu_per_request"] / plain["ms_cpu_per_request"], 3),
            "met": None,
        }
    for name, g in goals.items():
        verdict = "" if g["met"] is None else "MET" if g["met"] else "NOT MET"
        print(f"goal {name}: {g['goal']}  measured {g['measured']}  {verdict}")
    return goals


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for n in args.objects:
        await bench_n(n, args, results)
    goals = report(results)
    bl.bench_line(
        "list",
        {
            "mode": "quick" if args.quick else "full",
            "machine": info,
            "seconds": round(time.monotonic() - t0, 1),
            "connections": args.conns,
            "duration_s": args.duration,
            "page_limit": args.limit,
            "goals": goals,
            "results": results,
        },
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1,000 and 10,000 pods, full and paged, 3 s each (< 60 s)")
    p.add_argument("--objects", type=lambda s: [int(x) for x in s.split(",")], help="default 1000,10000,50000")
    p.add_argument("--modes", type=lambda s: s.split(","), help="full,paged,consistent")
    p.add_argument("--targets", type=lambda s: s.split(","), help="ceiling,proxy,sim")
    p.add_argument("--conns", type=int, default=4, help="client connections (default 4)")
    p.add_argument("--duration", type=float, help="seconds per measurement")
    p.add_argument("--limit", type=int, default=500, help="page size for paged lists")
    p.add_argument("--proxy-args", type=lambda s: s.split(), default=[], help="extra flags for the proxy targets")
    p.add_argument("--ceiling-no-join", action="store_true", help="ceiling-tls writes per-item buffers (writelines)")
    bl.add_production_flags(p)
    args = p.parse_args()
    args.prod = bl.production_from_args(args)
    if args.prod.tls and not args.targets:
        args.targets = ["ceiling", "ceiling-tls", "proxy", "proxy-http"]
    if args.quick:
        args.objects = args.objects or [1000, 10000]
        args.modes = args.modes or ["full", "paged"]
        args.targets = args.targets or ["ceiling", "proxy"]
        args.duration = args.duration or 3.0
    else:
        args.objects = args.objects or [1000, 10000, 50000]
        args.modes = args.modes or ["full", "paged", "consistent"]
        args.targets = args.targets or ["ceiling", "proxy", "sim"]
        args.duration = args.duration or 8.0
    bl.raise_nofile()
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(amain(args))


if __name__ == "__main__":
    main()

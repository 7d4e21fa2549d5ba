"""Broadcast fan-out in the production configuration, in front of kube-apiserver (issue 33's shape).

K watchers, each on its own TLS connection, watch the ConfigMaps of one namespace while a writer
updates 2 KB ConfigMaps of that namespace R times a second (every write stamped: latency = write
sent -> frame read). Variants, measured back to back in each round of one run:

* ``ceiling-tls``: the bare uvloop TLS server (``raw_fanout``) writing frames of the same object,
  each 10 ms tick's frames joined into one buffer per connection;
* ``proxy``: ``watchcache serve`` in the production configuration: TLS, ``--authentication
  delegated`` (reviews by the upstream), the default workers;
* ``proxy-w1``: the same with ``--workers 1``;
* ``direct``: the same watches on the upstream itself (kube-apiserver of the reference kit).

CPU per delivered event: the proxy's is its supervisor's plus every worker's. The upstream's
*fan-out* CPU is its CPU in the ``direct`` round minus its CPU in the proxy rounds, where it only
takes the writes and serves the proxy's one upstream watch (``upstream base`` below): what the
writes cost is not fan-out. Every window ends with the exact check (``fanout.exact_delivery``):
each watch read one frame per successful write, none missing, none extra.

The machine may be shared: CPU per delivery is the robust figure; the load average of each
window is printed beside it. ``--upstream sim`` runs the same shape against ``watchcache sim``
(no kit needed). Needs the kit for ``kube``: ``eval "$(/work/shared/tools/kube-reference/env.sh)"``.

Run: ``.venv/bin/python -m loadtest.bench.fanout_cm --quick`` (K=200, 5 s windows) or
``--watchers 1000 --rate 100 --window 8``; ``--profile`` adds py-spy profiles of every proxy process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import string
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench import fanout as fo
from loadtest.bench import kubecluster as kc
from loadtest.bench import lib as bl

NAMESPACE = "fanout-cm"
PREFIX = "fanout-cm-"
VARIANTS = ("ceiling-tls", "proxy", "proxy-w1", "direct")


@dataclass
class PidServer:
    """A server this benchmark did not start (kube-apiserver), known by its pid and URL."""

    name: str
    pid: int
    url: str

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        return host, int(port)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    def cpu(self) -> float:
        return bl.tree_cpu_seconds(self.pid)


@dataclass
class Supervisor:
    """The proxy's supervisor process alone (``bl.Proc.cpu`` counts it and every worker)."""

    pid: int

    def cpu(self) -> float:
        return bl.cpu_seconds(self.pid)


def configmap(name: str, size: int, rng: random.Random) -> dict[str, Any]:
    payload = "".join(rng.choice(string.ascii_letters) for _ in range(size))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"bench": "fanout-cm"},
            "annotations": {bl.STAMP_KEY: "0000000000.000000"},
        },
        "data": {"payload": payload},
    }


async def seed(up: kc.Upstream, count: int, size: int) -> tuple[list[str], bytes]:
    """The namespace and ``count`` ConfigMaps (reused when they exist); returns their names and a frame template."""
    t = up.target()
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await kc._requests(t, [("POST", "/api/v1/namespaces", json.dumps(ns).encode())])
    rng = random.Random(NAMESPACE)
    names = [f"{PREFIX}{i:03d}" for i in range(count)]
    base = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    statuses = await kc._requests(t, [("POST", base, json.dumps(configmap(n, size, rng)).encode()) for n in names])
    if set(statuses) - {201, 409}:
        raise SystemExit(f"creating ConfigMaps: {dict(statuses)}")
    status, obj = await kc._get_json(t, f"{base}/{names[0]}")
    if status != 200:
        raise SystemExit(f"GET {names[0]}: {status} {obj}")
    obj["metadata"]["annotations"][bl.STAMP_KEY] = "0000000000.000000"  # a run before left its stamp
    return names, json.dumps(obj, separators=(",", ":")).encode()


def watch_path() -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/configmaps?{fo.WATCH_QUERY}"


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    files = bl.ProductionFiles(any_delegated=args.upstream == "sim", any_tls=True)
    up = kc.kube_upstream() if args.upstream == "kube" else kc.sim_upstream(files)
    procs: dict[str, bl.Proc] = {}
    results: list[dict[str, Any]] = []
    tpl_path = Path(tempfile.mkstemp(prefix="bench-cm-", suffix=".json")[1])
    try:
        names, template = await seed(up, args.objects, args.size)
        tpl_path.write_bytes(template)
        bl.log(f"{up.kind} upstream {up.url}: {len(names)} ConfigMaps of {len(template)} bytes in {NAMESPACE}")
        prod = bl.Production(tls=True, authentication="delegated", workers=None)
        configs: dict[str, tuple[bl.Production, list[str]]] = {
            "proxy": (prod, []),
            "proxy-w1": (prod.but(workers=1), []),
        }
        for name, extra in args.extra_variant:
            configs[name] = (prod, extra)
            args.variants.append(name)
        for name in args.variants:
            if name in configs:
                cfg, extra = configs[name]
                procs[name] = kc.start_proxy(up, files, cfg, [*extra, *args.proxy_args])
                bl.log(f"started {name} ({cfg.label} {' '.join(extra)}) at {procs[name].url}")
            elif name == "ceiling-tls":
                cmd = bl.python_m("loadtest.bench.raw_fanout", "--template", str(tpl_path), *files.tls_args())
                procs[name] = bl.start_process("raw-fanout", cmd)
        upstream = PidServer(up.server, up.pids[up.server], up.url)
        token = up.token if up.kind == "kube" else files.client_token
        for rep in range(args.repeat):
            for variant in args.variants:
                target: fo.Served = upstream if variant == "direct" else procs[variant]
                cpu: dict[str, fo.CpuSource] = {"server": target}
                if variant.startswith("proxy"):
                    cpu["supervisor"] = Supervisor(procs[variant].pid)
                if not variant.startswith("ceiling"):
                    cpu["upstream"] = upstream
                    cpu.update({f"upstream {n}": PidServer(n, pid, up.url) for n, pid in up.pids.items()
                                if n != up.server})  # fmt: skip
                load: fo.Writer | fo.CeilingLoad
                if variant.startswith("ceiling"):
                    load = fo.CeilingLoad(procs[variant].url)
                else:
                    load = fo.Writer(up.url, names, [(NAMESPACE, n) for n in names], token=up.token,
                                     resource="configmaps", stamp_ns=NAMESPACE)  # fmt: skip
                load_avg = os.getloadavg()[0]
                r = await fo.measure(
                    variant=variant,
                    target=target,
                    load=load,
                    watchers=args.watchers,
                    rate=args.rate,
                    args=args,
                    cpu_procs=cpu,
                    token="" if variant.startswith("ceiling") else token,
                    probe_token=up.token if up.kind == "kube" else bl.ADMIN_TOKEN,
                    owner=fo.pods_owner(procs[variant], "configmaps") if variant.startswith("proxy") else None,
                    profile=args.profile and rep == 0 and variant.startswith("proxy"),
                    path="/watch" if variant.startswith("ceiling") else watch_path(),
                    check=not variant.startswith("ceiling"),
                )
                r["rep"], r["load_avg_1m"] = rep, round((load_avg + os.getloadavg()[0]) / 2, 2)
                results.append(r)
                if isinstance(target, bl.Proc):
                    await fo.settle(target, variant, resource="configmaps")
                else:
                    await asyncio.sleep(1.0)
    finally:
        bl.stop_all(procs.values())
        if not args.keep and up.kind == "sim":
            up.stop()
        files.cleanup()
        with contextlib.suppress(OSError):
            tpl_path.unlink()
    return results


def _med(rows: list[dict[str, Any]], key: str) -> float:
    return fo._median([float(r[key]) for r in rows if r.get(key) is not None])


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per variant (medians over rounds): CPU per delivery, latency, the exact check; then the goals."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        cpu = r["server_cpu"]
        d = r["delivered_s"] or float("nan")
        r["us_upstream_per_delivery"] = round(cpu["upstream"] / d * 1e6, 2) if "upstream" in cpu else None
        if "supervisor" in cpu:
            r["us_supervisor_per_delivery"] = round(cpu["supervisor"] / d * 1e6, 2)
        by.setdefault(r["variant"], []).append(r)
    # What the upstream spends without fan-out: the proxy rounds (writes + the proxy's one watch).
    base = [r["server_cpu"]["upstream"] for v in by if v.startswith("proxy") for r in by[v]]
    base_cores = fo._median(base) if base else float("nan")
    for r in by.get("direct", []):
        fan = r["server_cpu"]["server"] - base_cores
        r["us_fanout_per_delivery"] = round(fan / r["delivered_s"] * 1e6, 2) if r["delivered_s"] else None
    rows = []
    for v, rs in by.items():
        missing = sum(r.get("exact", {}).get("missing", 0) for r in rs)
        extra = sum(r.get("exact", {}).get("extra", 0) for r in rs)
        checked = all(r.get("exact", {}).get("ok", False) for r in rs) if "exact" in rs[0] else None
        rows.append(
            [
                v,
                len(rs),
                _med(rs, "delivered_s"),
                _med(rs, "delivered_fraction"),
                fo._median([r["server_cpu"]["server"] for r in rs]),
                _med(rs, "us_cpu_per_delivery"),
                _med(rs, "us_fanout_per_delivery") if v == "direct" else float("nan"),
                _med(rs, "us_supervisor_per_delivery") if v.startswith("proxy") else float("nan"),
                _med(rs, "us_upstream_per_delivery"),
                fo._median([r["latency_ms"]["p50"] for r in rs]),
                fo._median([r["latency_ms"]["p99"] for r in rs]),
                _med(rs, "frames_per_write"),
                _med(rs, "server_frames_per_write"),
                "-" if checked is None else f"{missing}/{extra}" + ("" if checked else " FAIL"),
                _med(rs, "load_avg_1m"),
            ]
        )
    print()
    bl.print_table(
        ["variant", "rounds", "deliveries/s", "of offered", "srv cores", "µs cpu/deliv", "µs fan-out/deliv",
         "µs supervisor", "µs upstream", "p50 ms", "p99 ms", "frames/read", "frames/write", "missing/extra", "load 1m"],
        rows,
        title=(f"ConfigMap fan-out: {args.watchers} TLS watchers x {args.rate:g} writes/s ({args.upstream} upstream); "
               f"upstream base (writes + the proxy's watch) {base_cores:.3f} cores; medians over rounds"),
    )  # fmt: skip
    goals: dict[str, Any] = {}

    def per_delivery(v: str, key: str = "us_cpu_per_delivery") -> float:
        return _med(by.get(v, []), key)

    kube_fan = per_delivery("direct", "us_fanout_per_delivery")
    for v in [v for v in by if v.startswith("proxy")]:
        mine = per_delivery(v)
        if kube_fan == kube_fan:
            m = round(mine / kube_fan, 3)
            goals[f"{v}_cpu_vs_upstream_fanout"] = {"goal": "<= 0.5", "measured": m, "met": m <= 0.5}
        ceil = per_delivery("ceiling-tls")
        if ceil == ceil:
            m = round(mine / ceil, 3)
            goals[f"{v}_cpu_vs_ceiling_tls"] = {"goal": "<= 1.3", "measured": m, "met": m <= 1.3}
        if "direct" in by:
            mine_p99 = fo._median([r["latency_ms"]["p99"] for r in by[v]])
            kube_p99 = fo._median([r["latency_ms"]["p99"] for r in by["direct"]])
            goals[f"{v}_p99_vs_upstream"] = {"goal": "<= 1.0", "measured": round(mine_p99 / kube_p99, 3),
                                             "met": mine_p99 <= kube_p99}  # fmt: skip
        exact = [r.get("exact", {}) for r in by[v]]
        goals[f"{v}_missing"] = {"goal": "0 missing, 0 extra", "measured": sum(e.get("missing", 0) for e in exact),
                                 "met": all(e.get("ok") for e in exact)}  # fmt: skip
    if "proxy" in by and "proxy-w1" in by:
        m = round(_med(by["proxy"], "delivered_s") / _med(by["proxy-w1"], "delivered_s"), 3)
        goals["delivered_default_workers_vs_w1"] = {"goal": ">= 0.97", "measured": m, "met": m >= 0.97}
    fo.print_profiles(results)
    for name, g in goals.items():
        print(f"goal {name}: {g['goal']}  measured {g['measured']}  {'MET' if g['met'] else 'NOT MET'}")
    return goals


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    t0 = time.monotonic()
    results = await run(args)
    goals = report(results, args)
    for r in results:
        r.pop("profile", None)
    bl.bench_line("fanout_cm", {"machine": info, "upstream": args.upstream, "watchers": args.watchers,
                                "rate": args.rate, "window_s": args.window, "seconds": round(time.monotonic() - t0, 1),
                                "goals": goals, "results": results})  # fmt: skip


def _extra(text: str) -> tuple[str, list[str]]:
    name, _, flags = text.partition("=")
    if not name.startswith("proxy-"):
        raise argparse.ArgumentTypeError("the variant's name starts with proxy-")
    return name, flags.split()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kit = bool(os.environ.get("KUBE_REFERENCE_URL"))
    p.add_argument("--upstream", choices=("kube", "sim"), default="kube" if kit else "sim")
    p.add_argument("--quick", action="store_true", help="K=200, 5 s windows, one round")
    p.add_argument("--watchers", type=int, default=1000)
    p.add_argument("--rate", type=float, default=100.0, help="ConfigMap writes/s (every one stamped)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS), help=",".join(VARIANTS))
    p.add_argument("--window", type=float, default=8.0, help="measurement window, s (keep <= 8 on a shared machine)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--repeat", type=int, default=1, help="rounds (variants alternate within each)")
    p.add_argument("--objects", type=int, default=20, help="ConfigMaps the writer cycles through")
    p.add_argument("--size", type=int, default=2048, help="bytes of data per ConfigMap")
    p.add_argument("--readers", type=int, default=2, help="reader processes")
    p.add_argument("--sample-conns", type=int, default=40, help="connections parsing stamps (latency)")
    p.add_argument(
        "--extra-variant",
        type=_extra,
        action="append",
        default=[],
        help='NAME=FLAGS: also the production proxy with FLAGS, e.g. "proxy-flush=--watch-flush-interval 0.01"',
    )
    p.add_argument("--proxy-args", type=lambda s: s.split(), default=[], help="extra flags for the proxies")
    p.add_argument("--profile", action="store_true", help="py-spy every proxy process in the first round")
    p.add_argument("--profile-seconds", type=float, default=6.0)
    p.add_argument("--profile-dir", default=str(Path(tempfile.gettempdir()) / "watchcache-bench"))
    p.add_argument("--keep", action="store_true", help="leave the sim upstream running (debugging)")
    args = p.parse_args()
    if args.quick:
        args.watchers, args.window = 200, 5.0
    args.stamp_rate = args.rate  # every write carries its time
    bl.raise_nofile()
    import uvloop

    uvloop.run(amain(args))


if __name__ == "__main__":
    main()

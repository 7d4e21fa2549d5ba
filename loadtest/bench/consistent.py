"""Consistent reads through the proxy: their tail against ``resourceVersion=0``, and read-after-write.

Upstream: the simulated cluster (``--upstream sim``, default) or the kube-apiserver on this
machine (``--upstream kube``, from ``KUBE_REFERENCE_*``: run ``eval "$(.../env.sh)"`` first).
``COUNT`` ConfigMaps (~1 KB each) are created in namespace ``NS`` (kube: deleted afterwards),
a few more in ``NS-small``; ``watchcache serve`` runs in front. While a writer keeps the
upstream busy (``--busy-rate`` writes/s, to Secrets by default: the etcd revision moves but the
ConfigMap cache gets no event, so every consistent read needs a proof — the hard case; ``--busy
same`` writes ConfigMaps of ``NS-small`` instead):

a) **LIST tail.** C clients (``python -m loadtest.bench.list_client``, one keep-alive connection each) LIST
   ``/api/v1/namespaces/NS/configmaps`` back to back, in rounds alternating
   ``resourceVersion=0`` and consistent (no resourceVersion). Reported: p50/p90/p99 of each,
   the upstream round trip (a consistent ``limit=1`` LIST sampled every 250 ms, measured
   directly), the goal ``p99(consistent) <= 1.2 * p99(rv=0) + rtt``, and the proxy's
   per-phase histograms (``watchcache_consistent_read_*_seconds``) over the consistent rounds.
b) **Write, then read.** N times, at random intervals: PATCH a ConfigMap of ``NS-small`` through
   the proxy, then at once a consistent GET of it (or LIST of ``NS-small``) through the proxy.
   A watch on the upstream (opened by the benchmark) times when the write's event arrives.
   Reported: the read's latency, and ``lag = read done - max(read start, event arrival)``,
   against the goal ``lag <= rtt``. Every read must return the write (read-your-writes).

Run: ``.venv/bin/python -m loadtest.bench.consistent [--upstream kube] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import ssl
import sys
import time
from typing import Any

import aiohttp

from loadtest.bench import lib as bl

PHASES = ("target", "events", "probe")


class Upstream:
    """Direct access to the upstream (not through the proxy): setup, the busy writer, the rtt sampler."""

    def __init__(self, url: str, token: str | None = None, ca: str | None = None) -> None:
        self.url = url
        self.headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if url.startswith("https") else False
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Upstream:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=64))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
        assert self.session is not None
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Content-Type": ctype}
        async with self.session.request(method, self.url + path, data=data, headers=headers) as resp:
            raw = await resp.read()
            return resp.status, (json.loads(raw) if raw else None)


def configmap(name: str, ns: str, size: int) -> dict[str, Any]:
    value = "x" * (size // 8)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench": "consistent"}},
        "data": {f"key-{i}": value for i in range(8)},
    }


async def delete_namespaces(up: Upstream, *names: str) -> None:
    """Delete the benchmark's namespaces and wait until they are gone.

    What they hold is deleted first, and a namespace left Terminating is finalized here: the
    reference cluster may run without kube-controller-manager, whose namespace controller
    would otherwise do both.
    """
    for name in names:
        if (await up.call("GET", f"/api/v1/namespaces/{name}"))[0] == 404:
            continue
        for kind in ("configmaps", "secrets"):
            await up.call("DELETE", f"/api/v1/namespaces/{name}/{kind}")
        status, _ = await up.call("DELETE", f"/api/v1/namespaces/{name}")
        bl.log(f"delete namespace {name}: {status}")
        for _ in range(100):
            status, ns = await up.call("GET", f"/api/v1/namespaces/{name}")
            if status == 404:
                break
            if _ == 20:  # still Terminating after 2 s: no namespace controller, finalize it as it would
                ns["spec"]["finalizers"] = []
                await up.call("PUT", f"/api/v1/namespaces/{name}/finalize", ns)
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"namespace {name} not deleted")
    bl.log("namespaces deleted")


async def create_objects(up: Upstream, ns: str, small: str, count: int, size: int) -> None:
    await delete_namespaces(up, ns, small)  # left by an earlier run
    for name in (ns, small):
        status, body = await up.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        if status not in (200, 201, 409):
            raise RuntimeError(f"create namespace {name}: {status} {body}")
    names = [(ns, f"cm-{i:05d}") for i in range(count)] + [(small, f"cm-{i}") for i in range(10)]
    todo = iter(names)
    done = 0

    async def worker() -> None:
        nonlocal done
        for namespace, name in todo:
            status, body = await up.call(
                "POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap(name, namespace, size)
            )
            if status not in (200, 201, 409):
                raise RuntimeError(f"create {namespace}/{name}: {status} {body}")
            done += 1
            if done % 2000 == 0:
                bl.log(f"created {done}/{len(names)} configmaps")

    await asyncio.gather(*(worker() for _ in range(32)))
    status, body = await up.call(
        "POST", f"/api/v1/namespaces/{small}/secrets", {"metadata": {"name": "busy"}, "data": {}}
    )
    if status not in (200, 201, 409):
        raise RuntimeError(f"create secret: {status} {body}")


async def busy_writer(up: Upstream, small: str, rate: float, kind: str, stop: asyncio.Event) -> int:
    """Writes at ``rate``/s: to a Secret (kind "other") or a ConfigMap of ``small`` ("same")."""
    path = f"/api/v1/namespaces/{small}/" + ("secrets/busy" if kind == "other" else "configmaps/cm-9")
    n = 0
    while not stop.is_set():
        t0 = time.monotonic()
        patch = {"metadata": {"annotations": {"bench/n": str(n)}}}
        status, _ = await up.call("PATCH", path, patch, "application/merge-patch+json")
        if status == 200:
            n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, 1.0 / rate - (time.monotonic() - t0)))
    return n


async def rtt_sampler(up: Upstream, ns: str, stop: asyncio.Event, out: list[float]) -> None:
    """One upstream round trip: a consistent LIST with limit=1 (what the proxy's target fetch is)."""
    while not stop.is_set():
        t0 = time.perf_counter()
        status, _ = await up.call("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=1")
        if status == 200:
            out.append(time.perf_counter() - t0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = bl.get_bytes(url + "/metrics").decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(
                ("watchcache_consistent_read_", "watchcache_consistency_", "apiserver_watch_cache_consistent")
            ):
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "worker"))
                out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def histogram_summary(before: dict[Any, float], after: dict[Any, float], name: str) -> dict[str, float]:
    """count, mean and the bucket bound below which 50/99% fall, of configmaps' ``name`` between two scrapes."""

    def delta(sample: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        rows = []
        for (n, lbl), v in after.items():
            d = dict(lbl)
            if n == sample and d.get("resource") == "configmaps" and all(d.get(k) == x for k, x in labels.items()):
                rows.append((d, v - before.get((n, lbl), 0.0)))
        return rows

    count = sum(v for _, v in delta(name + "_count"))
    total = sum(v for _, v in delta(name + "_sum"))
    buckets: dict[float, float] = {}
    for d, v in delta(name + "_bucket"):
        le = float(d["le"])
        buckets[le] = buckets.get(le, 0.0) + v
    out = {"n": count, "mean_ms": round(total / count * 1e3, 1) if count else float("nan")}
    for p in (50, 99):
        bound = float("nan")
        for le in sorted(buckets):
            if count and buckets[le] >= count * p / 100:
                bound = le
                break
        out[f"p{p}_le_ms"] = bound * 1e3
    return out


async def list_rounds(
    proxy: bl.Proc, args: argparse.Namespace, ns: str
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    host, port = proxy.address
    client = await bl.Helper.start(
        "list-client", "--host", host, "--port", str(port), "--connections", str(args.clients)
    )
    lat: dict[str, list[float]] = {"rv0": [], "consistent": []}
    phases: dict[str, Any] = {}
    try:
        await client.recv(timeout=60)
        paths = {
            "rv0": f"/api/v1/namespaces/{ns}/configmaps?resourceVersion=0",
            "consistent": f"/api/v1/namespaces/{ns}/configmaps",
        }
        before_all = after_all = None
        for r in range(args.rounds):
            for mode in ("rv0", "consistent"):
                before = scrape(proxy.url) if mode == "consistent" else None
                res = await client.ask(
                    "run", timeout=args.duration + 300, duration=args.duration, first=paths[mode], paged=False
                )
                if res["errors"]:
                    bl.log(f"{mode}: errors {res['errors'][:3]}")
                lat[mode].extend(res["req_lat"])
                s = bl.summarize(res["req_lat"])
                bl.log(f"round {r + 1} {mode:10}: n={s['n']} p50 {s['p50']} ms p99 {s['p99']} ms")
                if before is not None:
                    after = scrape(proxy.url)
                    before_all = before if before_all is None else before_all
                    # Sum of the consistent rounds only: the rv=0 rounds in between add nothing to these series.
                    after_all = after
        if before_all is not None and after_all is not None:
            for phase in PHASES:
                phases[phase] = histogram_summary(before_all, after_all, f"watchcache_consistent_read_{phase}_seconds")
            phases["total"] = histogram_summary(before_all, after_all, "watchcache_consistent_read_total_seconds")
            probes: dict[str, float] = {}
            for (n, lbl), v in after_all.items():
                d = dict(lbl)
                if n == "watchcache_consistency_probes_total" and d.get("resource") == "configmaps":
                    probes[d["outcome"]] = probes.get(d["outcome"], 0) + v - before_all.get((n, lbl), 0.0)
            phases["probes"] = probes
            fetches: dict[str, float] = {}
            for (n, lbl), v in after_all.items():
                d = dict(lbl)
                if n == "watchcache_consistency_target_fetches_total" and d.get("resource") == "configmaps":
                    fetches[d["outcome"]] = fetches.get(d["outcome"], 0) + v - before_all.get((n, lbl), 0.0)
            phases["target_fetches"] = fetches
    finally:
        await client.close()
    return lat, phases


async def write_then_read(proxy_url: str, up: Upstream, small: str, n: int, rtt: list[float]) -> dict[str, Any]:
    """PATCH through the proxy, then at once a consistent read through the proxy; event arrival from a direct watch."""
    arrivals: dict[int, float] = {}
    stop = asyncio.Event()
    status, listed = await up.call("GET", f"/api/v1/namespaces/{small}/configmaps")
    assert status == 200, listed
    start_rv = listed["metadata"]["resourceVersion"]

    async def watch() -> None:
        assert up.session is not None
        params = {"watch": "1", "resourceVersion": start_rv, "allowWatchBookmarks": "true", "timeoutSeconds": "600"}
        async with up.session.get(
            f"{up.url}/api/v1/namespaces/{small}/configmaps", params=params, headers=up.headers
        ) as resp:
            async for line in resp.content:
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED"):
                    arrivals[int(event["object"]["metadata"]["resourceVersion"])] = time.perf_counter()
                if stop.is_set():
                    return

    watcher = asyncio.ensure_future(watch())
    rows: list[dict[str, Any]] = []
    stale = 0
    async with aiohttp.ClientSession() as proxy:
        for i in range(n):
            await asyncio.sleep(random.uniform(0.05, 0.6))
            name = f"cm-{i % 8}"
            path = f"/api/v1/namespaces/{small}/configmaps/{name}"
            patch = json.dumps({"data": {"n": str(i)}}).encode()
            headers = {"Content-Type": "application/merge-patch+json", **up.headers}
            async with proxy.patch(proxy_url + path, data=patch, headers=headers) as resp:
                written = json.loads(await resp.read())
            w = int(written["metadata"]["resourceVersion"])
            kind = "get" if i % 2 == 0 else "list"
            t0 = time.perf_counter()
            target = path if kind == "get" else f"/api/v1/namespaces/{small}/configmaps"
            async with proxy.get(proxy_url + target, headers=up.headers) as resp:
                body = json.loads(await resp.read())
                code = resp.status
            t1 = time.perf_counter()
            got = (
                body if kind == "get" else next((o for o in body.get("items", []) if o["metadata"]["name"] == name), {})
            )
            if code != 200 or int(got.get("metadata", {}).get("resourceVersion", 0)) < w:
                stale += 1
            rows.append({"kind": kind, "w": w, "t0": t0, "t1": t1})
        await asyncio.sleep(0.5)
    stop.set()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await watcher
    latency = [r["t1"] - r["t0"] for r in rows]
    lag = [r["t1"] - max(r["t0"], arrivals[r["w"]]) for r in rows if r["w"] in arrivals]
    rtt_p50 = bl.percentile(sorted(rtt), 50) if rtt else float("nan")
    within = sum(1 for x in lag if x <= rtt_p50) / len(lag) if lag else float("nan")
    return {
        "reads": len(rows),
        "stale": stale,
        "latency_ms": bl.summarize(latency),
        "latency_get_ms": bl.summarize([r["t1"] - r["t0"] for r in rows if r["kind"] == "get"]),
        "latency_list_ms": bl.summarize([r["t1"] - r["t0"] for r in rows if r["kind"] == "list"]),
        "lag_after_event_ms": bl.summarize(lag),
        "event_seen": len(lag),
        "fraction_within_rtt_p50": round(within, 3),
    }


def start_upstream(args: argparse.Namespace) -> tuple[bl.Proc | None, Upstream, list[str]]:
    """The upstream process (None for kube), a client of it, and the proxy's flags to reach it."""
    if args.upstream == "kube":
        for var in ("KUBE_REFERENCE_URL", "KUBE_REFERENCE_TOKEN", "KUBE_REFERENCE_KUBECONFIG", "KUBE_REFERENCE_CA"):
            if not os.environ.get(var):
                raise SystemExit(f'--upstream kube needs {var}: eval "$(/work/shared/tools/kube-reference/env.sh)"')
        up = Upstream(
            os.environ["KUBE_REFERENCE_URL"], os.environ["KUBE_REFERENCE_TOKEN"], os.environ["KUBE_REFERENCE_CA"]
        )
        # No delegated authentication: the benchmark's LIST clients send no credentials.
        return None, up, ["--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"], "--authentication", "none"]
    sim = bl.start_sim(objects=0, namespaces=1)
    bl.wait_ready(sim)
    return sim, Upstream(sim.url), ["--upstream", sim.url]


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    ns, small = args.namespace, args.namespace + "-small"
    sim, up, upstream_flags = start_upstream(args)
    proxy = None
    result: dict[str, Any] = {"upstream": args.upstream, "objects": args.objects, "clients": args.clients}
    t_start = time.monotonic()
    async with up:
        try:
            bl.log(f"creating {args.objects} configmaps in {ns} on the upstream")
            await create_objects(up, ns, small, args.objects, args.size)
            exe = bl.watchcache_exe()
            if args.proxy_src:  # another copy of the package for the proxy only (e.g. main's, for "before")
                boot = f"import sys; sys.path.insert(0, {args.proxy_src!r}); from watchcache.cli import main; "
                boot += "sys.exit(main())"
                exe = [sys.executable, "-c", boot]
            cmd = [*exe, "serve", "--listen", "127.0.0.1:0", *upstream_flags, *args.proxy_args]
            proxy = bl.start_process("proxy", cmd)
            bl.wait_ready(proxy, 300)
            bl.wait_objects(proxy, "configmaps", args.objects)
            stop = asyncio.Event()
            rtt: list[float] = []
            tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(rtt_sampler(up, small, stop, rtt))]
            if args.busy != "none":
                tasks.append(asyncio.ensure_future(busy_writer(up, small, args.busy_rate, args.busy, stop)))
            await asyncio.sleep(1.0)
            lat, phases = await list_rounds(proxy, args, ns)
            wtr = await write_then_read(proxy.url, up, small, args.write_reads, rtt)
            stop.set()
            done = await asyncio.gather(*tasks)
            result["busy_writes"] = done[1] if len(done) > 1 else 0
            rtt_s = bl.summarize(rtt)
            rv0, cons = bl.summarize(lat["rv0"]), bl.summarize(lat["consistent"])
            goal = 1.2 * rv0["p99"] + rtt_s["p50"]
            result.update(
                {
                    "rtt_ms": rtt_s,
                    "list_rv0_ms": rv0,
                    "list_consistent_ms": cons,
                    "p99_ratio_consistent_vs_rv0": round(cons["p99"] / rv0["p99"], 2) if rv0["p99"] else None,
                    "goal_p99_ms": round(goal, 1),
                    "goal_met": cons["p99"] <= goal,
                    "phases": phases,
                    "write_then_read": wtr,
                }
            )
        finally:
            if proxy is not None:
                proxy.stop()
            if args.upstream == "kube" and not args.keep:
                await delete_namespaces(up, ns, small)
            if sim is not None:
                sim.stop()
    report(result)
    bl.bench_line(
        "consistent",
        {
            "machine": info,
            "seconds": round(time.monotonic() - t_start, 1),
            "args": vars(args) | {"proxy_args": args.proxy_args},
            **result,
        },
    )


def report(r: dict[str, Any]) -> None:
    print()
    rows = []
    for name, key in (("rv=0", "list_rv0_ms"), ("consistent", "list_consistent_ms")):
        s = r[key]
        rows.append([name, s["n"], s["p50"], s["p90"], s["p99"], s["max"]])
    rows.append(
        [
            "upstream rtt (limit=1)",
            r["rtt_ms"]["n"],
            r["rtt_ms"]["p50"],
            r["rtt_ms"]["p90"],
            r["rtt_ms"]["p99"],
            r["rtt_ms"]["max"],
        ]
    )
    bl.print_table(
        ["LIST of the namespace", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        rows,
        title=f"a) {r['clients']} clients, {r['objects']} ConfigMaps, upstream {r['upstream']}, "
        f"{r.get('busy_writes', 0)} busy writes",
    )
    print(
        f"p99 consistent / rv=0: {r['p99_ratio_consistent_vs_rv0']}; goal p99 <= 1.2 * {r['list_rv0_ms']['p99']} + "
        f"{r['rtt_ms']['p50']} = {r['goal_p99_ms']} ms: {'MET' if r['goal_met'] else 'NOT MET'}"
    )
    ph = r["phases"]
    if ph:
        bl.print_table(
            ["phase (proxy metrics)", "n", "mean ms", "p50 <= ms", "p99 <= ms"],
            [
                [k, v["n"], v["mean_ms"], v["p50_le_ms"], v["p99_le_ms"]]
                for k, v in ph.items()
                if k in (*PHASES, "total")
            ],
            title="consistent reads by phase (histogram buckets)",
        )
        print("probes by outcome:", {k: int(v) for k, v in ph.get("probes", {}).items()}, end="; ")
        print("target fetches:", {k: int(v) for k, v in ph.get("target_fetches", {}).items()})
    w = r["write_then_read"]
    rows = [
        ["read latency (all)", *(w["latency_ms"][k] for k in ("n", "p50", "p90", "p99", "max"))],
        ["  GET", *(w["latency_get_ms"][k] for k in ("n", "p50", "p90", "p99", "max"))],
        ["  LIST (10 objects)", *(w["latency_list_ms"][k] for k in ("n", "p50", "p90", "p99", "max"))],
        ["done - max(start, event)", *(w["lag_after_event_ms"][k] for k in ("n", "p50", "p90", "p99", "max"))],
    ]
    bl.print_table(["b) write, then consistent read", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    print(f"stale reads: {w['stale']} of {w['reads']}; lag <= rtt p50 for {w['fraction_within_rtt_p50']:.0%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", choices=("sim", "kube"), default="sim")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--size", type=int, default=1000, help="bytes of data per ConfigMap (default 1000)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=15.0, help="seconds per round and mode")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--busy", choices=("other", "same", "none"), default="other")
    p.add_argument("--busy-rate", type=float, default=20.0)
    p.add_argument("--write-reads", type=int, default=100)
    p.add_argument("--namespace", default="consistency")
    p.add_argument("--keep", action="store_true", help="kube: keep the namespaces")
    p.add_argument("--proxy-src", help="run the proxy from this source tree (e.g. `git archive main | tar -x -C DIR`)")
    p.add_argument("--quick", action="store_true", help="1,000 objects, 5 s rounds, 30 write-reads")
    p.add_argument("--proxy-args", type=lambda s: s.split(), default=["--workers", "1"], help="(default --workers 1)")
    args = p.parse_args()
    if args.quick:
        args.objects, args.duration, args.write_reads = 1000, 5.0, 30
    bl.raise_nofile()
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(amain(args))


if __name__ == "__main__":
    main()

"""Node-scoped fan-out: K kubelet-shaped clients, a writer updating pods, the proxy next to its upstream.

A large cluster's biggest population of watchers is its kubelets, and each pod update concerns
one of them. For each K (``--kubelets``) and each target (``--targets``: ``proxy`` = ``watchcache
serve`` in front of the upstream; ``upstream`` = kube-apiserver of the reference kit, or the
simulated cluster with ``--upstream sim``), in one run:

1. K kubelets (``loadtest.bench.kubelet_clients``, ``--client-procs`` processes) each LIST+WATCH their node's
   pods (``fieldSelector=spec.nodeName=<node>``), their Node (``metadata.name``) and
   ``--cm-per-kubelet`` ConfigMaps by name: 7 watches per kubelet by default, over TLS (HTTP/1.1,
   one connection per watch; ``--h2``: one HTTP/2 connection per kubelet), asking for protobuf
   (``--accept``).
2. Idle (``--idle`` s): the server's RSS before and after the watches (RSS per idle watch) and
   its CPU with nothing written (bookmarks, timers).
3. For each rate R (``--rates``) and selection (``--select``): ``loadtest.bench.pod_writer`` patches
   random pods on the upstream at R/s for ``--window`` s; ``watched`` pods are on the first K
   nodes (each update selected by exactly one watcher), ``unwatched`` ones on the spare nodes
   (selected by none: the cost of an event nobody wants). Measured over the window: the server's
   CPU (``/proc``: the proxy's process tree; kube-apiserver and etcd apart), per written and per
   delivered event, and *marginal* (minus the idle CPU); delivery latency (stamp written → event
   received, every event); events missing, misrouted or repeated (the writer's stamps per node
   against the ones each node's pod watch received).

``floor``: ``loadtest.bench.relay_floor``, the cheapest Python relay of pod events by node (one
upstream watch, ``orjson.loads`` and one write per event; LISTs answered empty, nothing else), in
the proxy's place with its certificate and upstream credentials, measured alike: proxy − floor is
the proxy's own code, the floor what any Python relay pays at that rate on that machine.

Kube-apiserver's own fan-out cost is the difference between its CPU when the kubelets watch it
and its CPU at the same rate while they watch the proxy (it then serves the writes and one watch
per resource): both are in the same run.

The objects (``kubecluster.Layout``: ``--prefix``-named Nodes, pods, ConfigMaps) are created on
the upstream if missing and deleted at the end (``--keep`` keeps them for the next run). The
proxy runs in the production configuration (TLS, ``--authentication delegated``, ``--workers 1``)
with the product's defaults otherwise: add flags with ``--proxy-args``.

``--node-identities`` (kube-apiserver only): each kubelet is its own node, ``system:node:<node>`` in
``system:nodes``, by a client certificate the kit's CA signs (``loadtest.bench.nodecerts``, cached in
``~/.cache``), as real kubelets are: kube's Node authorizer decides what it may read (its pods by
``spec.nodeName``, its Node, the ConfigMaps its pods mount: so it watches at most
``--pods-per-node`` of them) and flow control classifies it by the ``system-nodes`` and
``system-node-high`` FlowSchemas. The proxy gets ``--client-ca-file`` (the kit's CA) and the kit's
front-proxy pair. Each target's flow-control metrics over the connect phase (dispatched, refused by
reason, mean wait per level and schema) are in the idle row. ``--connect-only``: the connect burst
and the idle phase only, no writes.

Run: ``.venv/bin/python -m loadtest.bench.kubelets --quick`` (a small K, ~3 min), or e.g.
``--kubelets 1000,2000,5000 --rates 100,500`` (the issue's points).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import tempfile
import time
from typing import Any

from loadtest.bench import flowmetrics as fm
from loadtest.bench import kubecluster as kc
from loadtest.bench import lib as bl
from loadtest.bench import nodecerts
from loadtest.bench.kubeclient import FrameSplitter, H1Conn, Sink, frame_type, query


def split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    n = hi - lo
    parts = max(1, min(parts, n))
    bounds = [lo + n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------- node churn on the kit


class _Counter(Sink):
    def __init__(self) -> None:
        self.splitter = FrameSplitter(False)
        self.events = 0
        self.last = time.monotonic()

    def on_data(self, data: bytes) -> None:
        for frame in self.splitter.feed(data):
            if frame_type(frame) != "BOOKMARK":
                self.events += 1
                self.last = time.monotonic()


async def wait_nodes_quiet(up: kc.Upstream, layout: kc.Layout, created_at: float | None, quiet: float = 10.0) -> None:
    """On the kit, wait out the node-lifecycle controller's writes to freshly created fake Nodes.

    It marks them NotReady and taints them about 50 s after they appear (no kubelet renews them);
    those Node events would land in a measurement window.
    """
    if up.kind != "kube":
        return
    conn = await up.target().connect()
    assert isinstance(conn, H1Conn)
    sink = _Counter()
    path = "/api/v1/nodes" + query(
        labelSelector=f"bench={layout.prefix}",
        watch=True,
        allowWatchBookmarks=True,
        resourceVersion="0",
        timeoutSeconds=600,
    )
    conn.request("GET", path, sink)
    grace = 0.0 if created_at is None else max(0.0, created_at + 65.0 - time.monotonic())
    if grace:
        bl.log(f"waiting {grace:.0f} s for the node-lifecycle controller to mark the new Nodes")
        await asyncio.sleep(grace)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and time.monotonic() - sink.last < quiet:
        await asyncio.sleep(1)
    bl.log(f"node events seen while waiting: {sink.events}")
    conn.close()


# ---------------------------------------------------------------- one target at one K


class Server:
    """The process(es) whose CPU and RSS are the target's: the proxy's tree, the floor, or the upstream's server."""

    def __init__(self, name: str, up: kc.Upstream, proc: bl.Proc | None) -> None:
        self.name = name
        self.up = up
        self.proc = proc  # the proxy or the floor; None: the upstream itself

    def cpu(self) -> dict[str, float]:
        out = self.up.cpu()
        if self.proc is not None:
            out[self.name] = self.proc.cpu()
            pids = self.proc.pids()
            # Of which in the kernel (on loopback a send also runs the receiver's TCP path).
            out[f"{self.name}-system"] = sum(_system_seconds(pid) for pid in pids)
            # The scheduler's own count (ns, every thread), not the tick sampling above; and the
            # voluntary context switches: how often the server slept and was woken.
            sched, switches = _sched(pids)
            out[f"{self.name}-sched"] = sched
            out[f"{self.name}-switches"] = switches
            out[f"{self.name}-minflt"] = float(sum(_minor_faults(pid) for pid in pids))
        return out

    def rss(self) -> int:
        if self.proc is not None:
            return self.proc.rss()
        return self.up.rss().get(self.up.server, 0)

    @property
    def key(self) -> str:
        return self.name if self.proc is not None else self.up.server


def start_floor(up: kc.Upstream, files: bl.ProductionFiles, extra: list[str]) -> bl.Proc:
    """``relay_floor`` in front of ``up``, with the proxy's serving certificate and upstream credentials."""
    assert files.cert is not None
    if up.kind == "kube":
        upstream = ["--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"]]
    else:
        upstream = ["--upstream", up.url, "--insecure-skip-tls-verify", "--token-file", str(files.token_file)]
    cmd = bl.python_m(
        "loadtest.bench.relay_floor",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        str(files.cert[0]),
        "--tls-private-key-file",
        str(files.cert[1]),
        *upstream,
        *extra,
    )
    proc = bl.start_process("floor", cmd)
    try:
        bl.wait_ready(proc, 60)
    except BaseException:
        proc.stop()
        raise
    return proc


def _sched(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds from /proc/<pid>/task/*/schedstat, voluntary context switches) of the processes."""
    ns = switches = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        ns += int(f.read().split()[0])
                    with open(f"/proc/{pid}/task/{tid}/status") as f:
                        for line in f:
                            if line.startswith("voluntary_ctxt_switches:"):
                                switches += int(line.split()[1])
    return ns / 1e9, float(switches)


_COUNTS = ("-switches", "-minflt")  # Server.cpu's counters that are not CPU seconds (the idle row's keys)


def _minor_faults(pid: int) -> int:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2 :].split()[7])
    return 0


def _system_seconds(pid: int) -> float:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2 :].split()[12]) / bl.CLK_TCK
    return 0.0


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in b if k in a}


async def measure_target(
    args: argparse.Namespace,
    up: kc.Upstream,
    layout: kc.Layout,
    files: bl.ProductionFiles,
    k: int,
    target_name: str,
    writer: bl.Helper | None,
    rows: list[dict[str, Any]],
) -> None:
    proc = None  # the proxy or the floor
    if target_name == "proxy":
        prod = bl.Production(tls=True, authentication=args.authentication, workers=args.workers)
        extra = shlex.split(args.proxy_args) + (["--http2"] if args.h2 else []) + nodecerts.proxy_flags(args.cert_dir)
        bl.log(f"K={k}: starting the proxy ({prod.label} {' '.join(extra)})")
        proc = kc.start_proxy(up, files, prod, extra)
        url = proc.url
    elif target_name == "floor":
        bl.log(f"K={k}: starting the relay floor (loadtest.bench.relay_floor)")
        proc = start_floor(up, files, shlex.split(args.floor_args))
        url = proc.url
    else:
        url = up.url
    server = Server(target_name, up, proc)
    clients: list[bl.Helper] = []
    base: dict[str, Any] = {"K": k, "target": target_name, "server": server.key}
    try:
        await asyncio.sleep(args.settle)
        rss0 = server.rss()
        flow0, cpu0 = await fm.snapshot(url, up.token, up.ca if server.proc is None else ""), server.cpu()
        for lo, hi in split(0, k, args.client_procs):
            clients.append(
                await bl.Helper.start(
                    "kubelet-clients",
                    "--target",
                    url,
                    "--token",
                    "" if args.cert_dir else up.token,
                    "--ca",
                    up.ca if server.proc is None else "",
                    "--cert-dir",
                    args.cert_dir,
                    "--accept",
                    args.accept,
                    "--lo",
                    str(lo),
                    "--hi",
                    str(hi),
                    "--node-prefix",
                    layout.node_prefix,
                    "--namespace",
                    layout.namespace,
                    "--cm-prefix",
                    layout.cm_prefix,
                    "--configmaps",
                    str(layout.configmaps),
                    "--cm-per-kubelet",
                    str(nodecerts.cm_per_kubelet(args.cm_per_kubelet, args.pods_per_node, args.cert_dir)),
                    "--watch-timeout",
                    str(args.watch_timeout),
                    "--source-addresses",
                    str(args.source_addresses),
                    *(["--h2"] if args.h2 else []),
                )
            )
        t0 = time.monotonic()
        connected = await bl.ask_all(
            clients, "connect", timeout=args.connect_timeout + 60, deadline=args.connect_timeout
        )
        connect_s, connect_cpu = time.monotonic() - t0, _delta(cpu0, server.cpu())
        watches = sum(c["watches"] for c in connected)
        established = sum(c["established"] for c in connected)
        statuses: dict[str, int] = {}
        for c in connected:
            for s, n in c["statuses"].items():
                statuses[s] = statuses.get(s, 0) + n
        errors = [e for c in connected for e in c["errors"]][:5]
        gets, gets_ok = sum(c["gets"] for c in connected), sum(c["gets_ok"] for c in connected)
        flow = fm.summary(
            fm.delta(flow0, await fm.snapshot(url, up.token, up.ca if server.proc is None else "")),
            nodecerts.FLOW_SCHEMAS if args.cert_dir else (),
        )
        bl.log(
            f"K={k} {target_name}: {established}/{watches} watches, {gets_ok}/{gets} Node GETs in {connect_s:.1f} s; "
            f"failed requests {statuses or 'none'} {errors or ''} (load {loadavg()})"
        )
        cpu_s = {n: round(v, 1) for n, v in connect_cpu.items() if not n.endswith(_COUNTS)}
        bl.log(f"  flow control over the connect: {json.dumps(flow)}; CPU s {cpu_s}")
        await asyncio.sleep(args.settle)
        rss1 = server.rss()
        # Idle: nothing written.
        c0, m0, t_0 = server.cpu(), bl.machine_busy()[0], time.monotonic()
        await asyncio.sleep(args.idle)
        c1, m1, t_1 = server.cpu(), bl.machine_busy()[0], time.monotonic()
        idle = _delta(c0, c1)
        idle_s = t_1 - t_0
        idle_rates = {name: v / idle_s for name, v in idle.items()}
        row_idle = {
            **base,
            "phase": "idle",
            "watches": watches,
            "established": established,
            "connect_s": round(connect_s, 2),
            "connect_cpu_s": cpu_s,
            "node_gets": gets,
            "node_gets_ok": gets_ok,
            "failed_requests": statuses,
            "flowcontrol": flow,
            "rss_before_mb": round(rss0 / 2**20, 1),
            "rss_after_mb": round(rss1 / 2**20, 1),
            "kb_per_watch": round((rss1 - rss0) / 1024 / max(1, established), 2),
            "mb_per_1000_watches": round((rss1 - rss0) / 2**20 / max(1, established) * 1000, 2),
            "idle_cores": {name: round(v, 4) for name, v in idle_rates.items() if not name.endswith(_COUNTS)},
            "idle_per_s": {name: round(v, 1) for name, v in idle_rates.items() if name.endswith(_COUNTS)},
            "machine_busy_cores": round((m1 - m0) / idle_s, 2),
            "loadavg": loadavg(),
        }
        rows.append(row_idle)
        bl.log(
            f"  idle: RSS {row_idle['rss_before_mb']} -> {row_idle['rss_after_mb']} MB "
            f"({row_idle['kb_per_watch']} KB per watch), cores {row_idle['idle_cores']}"
        )
        for rate in args.rate_list:
            for select in args.select_list:
                nodes = list(range(k)) if select == "watched" else list(range(k, layout.nodes))
                if not nodes:
                    continue
                since = time.time()
                started = await bl.ask_all(clients, "record-start", since=since)
                watching = {i for c in started for i in c["watching"]}
                s0 = await bl.ask_all(clients, "snap")
                c0, m0, t_0 = server.cpu(), bl.machine_busy()[0], time.monotonic()
                profiling = None
                if args.profile and proc is not None:
                    from loadtest.bench.fanout import run_profile

                    args.profile_seconds = args.window
                    profiling = asyncio.ensure_future(run_profile(proc, args, f"kubelets-K{k}-R{rate}-{select}"))
                assert writer is not None
                w = await writer.ask(
                    "run",
                    timeout=args.window * 4 + 120,
                    rate=rate,
                    seconds=args.window,
                    nodes=nodes,
                    seed=f"{k}-{rate}-{select}",
                )
                await asyncio.sleep(args.drain)
                c1, m1, t_1 = server.cpu(), bl.machine_busy()[0], time.monotonic()
                profile = await profiling if profiling is not None else None
                recs = await bl.ask_all(clients, "record-stop")
                s1 = await bl.ask_all(clients, "snap")
                rows.append(
                    summarize_window(
                        base,
                        watching,
                        rate,
                        select,
                        w,
                        recs,
                        s0,
                        s1,
                        _delta(c0, c1),
                        t_1 - t_0,
                        m1 - m0,
                        idle_rates,
                        server.key,
                    )
                )
                r = rows[-1]
                if profile is not None:
                    r["profile"] = profile
                    for label, proc in profile["processes"].items():
                        bl.log(f"  profile {label}: active {proc['active_pct']}%; self: {proc['self_top'][:8]}")
                        bl.log(f"    inclusive: {proc['inclusive_top'][:12]}")
                bl.log(
                    f"  R={rate} {select}: written {r['written']} ({r['write_rate']}/s), delivered "
                    f"{r['delivered']}, missing {r['missing']} (+{r['not_delivered_no_watch']} without a watch), "
                    f"p50/p99 {r['p50_ms']}/{r['p99_ms']} ms, "
                    f"{r['us_per_written']} µs/written ({r['us_marginal_per_written']} marginal), "
                    f"cpu s {r['cpu_s']}, "
                    f"load {loadavg()}"
                )
        final = await bl.ask_all(clients, "snap")
        rows.append(
            {
                **base,
                "phase": "end",
                "open": sum(s["open"] for s in final),
                "ended": sum(s["ended"] for s in final),
                "relists": sum(s["relists"] for s in final),
                "reconnects": sum(s["reconnects"] for s in final),
                "client_cpu_s": round(sum(s["cpu"] for s in final), 2),
            }
        )
    finally:
        for helper in clients:
            await helper.close()
        if proc is not None:
            proc.stop()


def summarize_window(
    base: dict[str, Any],
    watching: set[int],
    rate: int,
    select: str,
    w: dict[str, Any],
    recs: list[dict[str, Any]],
    s0: list[dict[str, Any]],
    s1: list[dict[str, Any]],
    cpu: dict[str, float],
    seconds: float,
    machine: float,
    idle_rates: dict[str, float],
    key: str,
) -> dict[str, Any]:
    written: dict[str, list[str]] = w["stamps"]
    received: dict[str, list[str]] = {}
    lat: list[float] = []
    for r in recs:
        lat.extend(r["lat"])
        for node, stamps in r["stamps"].items():
            received.setdefault(node, []).extend(stamps)
    n_written = sum(len(v) for v in written.values())
    missing = misrouted = repeated = unwatched = 0
    for node in set(written) | set(received):
        ws, rs = set(written.get(node, ())), received.get(node, [])
        rset = set(rs)
        if int(node) in watching:  # its pod watch was open: each of its writes is owed to it
            missing += len(ws - rset)
        elif int(node) < base["K"]:  # a kubelet whose pod watch was not open (refused, retrying)
            unwatched += len(ws - rset)
        misrouted += len(rset - ws)
        repeated += len(rs) - len(rset)
    delivered = sum(len(v) for v in received.values())
    lat.sort()
    cpu = dict(cpu)
    switches = cpu.pop(f"{key}-switches", None)
    faults = cpu.pop(f"{key}-minflt", None)
    sched = cpu.get(f"{key}-sched")
    server_cpu = cpu.get(key, 0.0)
    marginal = server_cpu - idle_rates.get(key, 0.0) * seconds
    events: dict[str, int] = {}
    for a, b in zip(s0, s1, strict=True):
        for name, n in b["events"].items():
            events[name] = events.get(name, 0) + n - a["events"].get(name, 0)
    out = {
        **base,
        "phase": "write",
        "R": rate,
        "select": select,
        "written": n_written,
        "write_rate": w["rate"],
        "write_errors": w["errors"],
        "write_ms_p50": w["write_ms_p50"],
        "delivered": delivered,
        "missing": missing,
        "not_delivered_no_watch": unwatched,
        "misrouted": misrouted,
        "repeated": repeated,
        "events": events,
        "p50_ms": round(bl.percentile(lat, 50) * 1000, 1) if lat else None,
        "p99_ms": round(bl.percentile(lat, 99) * 1000, 1) if lat else None,
        "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        "seconds": round(seconds, 2),
        "cpu_s": {name: round(v, 3) for name, v in cpu.items()},
        "server_cores": round(server_cpu / seconds, 3),
        "us_per_written": round(server_cpu / n_written * 1e6, 1) if n_written else None,
        "us_marginal_per_written": round(marginal / n_written * 1e6, 1) if n_written else None,
        "us_per_delivered": round(server_cpu / delivered * 1e6, 1) if delivered else None,
        # Cross-checks of the proxy's and the floor's per-event cost (None for the upstream target).
        "us_sched_per_written": round(sched / n_written * 1e6, 1) if sched is not None and n_written else None,
        "us_sched_marginal_per_written": (
            round((sched - idle_rates.get(f"{key}-sched", 0.0) * seconds) / n_written * 1e6, 1)
            if sched is not None and n_written
            else None
        ),
        "wakeups_per_written": round(switches / n_written, 2) if switches is not None and n_written else None,
        "minor_faults_per_written": round(faults / n_written, 2) if faults is not None and n_written else None,
        "machine_busy_cores": round(machine / seconds, 2),
        "loadavg": loadavg(),
    }
    for name in ("kube-apiserver", "etcd", "sim"):
        if name in cpu and name != key:
            out[f"us_{name}_per_written"] = round(cpu[name] / n_written * 1e6, 1) if n_written else None
    return out


# ---------------------------------------------------------------- report


def report(rows: list[dict[str, Any]], up: kc.Upstream) -> dict[str, Any]:
    idle = [r for r in rows if r["phase"] == "idle"]
    bl.print_table(
        [
            "K",
            "target",
            "watches",
            "established",
            "connect s",
            "failed requests",
            "RSS before MB",
            "RSS after MB",
            "KB / idle watch",
            "idle cores",
            "load",
        ],
        [
            [
                r["K"],
                r["target"],
                r["watches"],
                r["established"],
                r["connect_s"],
                " ".join(f"{k}:{v}" for k, v in r["failed_requests"].items()) or "-",
                r["rss_before_mb"],
                r["rss_after_mb"],
                r["kb_per_watch"],
                r["idle_cores"].get(r["server"], 0.0),
                r["loadavg"],
            ]
            for r in idle
        ],
        title="\nWatches, memory and idle CPU",
    )
    writes = [r for r in rows if r["phase"] == "write"]
    bl.print_table(
        [
            "K",
            "target",
            "R",
            "select",
            "written/s",
            "delivered",
            "missing",
            "no watch",
            "misrouted",
            "repeated",
            "p50 ms",
            "p99 ms",
            "server cores",
            "µs / written",
            "µs marginal / written",
            "µs / delivered",
            "µs sched marginal / written",
            "wakeups / written",
            "faults / written",
            f"µs {up.server} / written",
            "machine busy",
            "load",
        ],
        [
            [
                r["K"],
                r["target"],
                r["R"],
                r["select"],
                r["write_rate"],
                r["delivered"],
                r["missing"],
                r["not_delivered_no_watch"],
                r["misrouted"],
                r["repeated"],
                r["p50_ms"],
                r["p99_ms"],
                r["server_cores"],
                r["us_per_written"],
                r["us_marginal_per_written"],
                r["us_per_delivered"],
                r.get("us_sched_marginal_per_written"),
                r.get("wakeups_per_written"),
                r.get("minor_faults_per_written"),
                r.get(f"us_{up.server}_per_written", r["us_per_written"] if r["server"] == up.server else None),
                r["machine_busy_cores"],
                r["loadavg"],
            ]
            for r in writes
        ],
        title="\nWrites: server CPU per event, latency, correctness",
    )
    # The upstream's fan-out cost: its CPU with the kubelets on it minus its CPU with them on the proxy.
    summary: dict[str, Any] = {"upstream_fanout_us_per_written": {}, "proxy_marginal_us_per_written": {}}
    by = {(r["K"], r["target"], r["R"], r["select"]): r for r in writes}
    for (k, target, rate, select), r in by.items():
        if target != "upstream":
            continue
        p = by.get((k, "proxy", rate, select))
        if p is None or not r["written"] or not p["written"]:
            continue
        direct = r["cpu_s"].get(up.server, 0.0) / r["written"]
        behind = p["cpu_s"].get(up.server, 0.0) / p["written"]
        summary["upstream_fanout_us_per_written"][f"K={k} R={rate} {select}"] = round((direct - behind) * 1e6, 1)
    for (k, target, rate, select), r in by.items():
        if target == "proxy":
            summary["proxy_marginal_us_per_written"][f"K={k} R={rate} {select}"] = r["us_marginal_per_written"]
    # The floor (relay_floor): what the cheapest Python relay costs in the same regime, and the proxy's excess.
    for (k, target, rate, select), r in by.items():
        if target != "floor":
            continue
        summary.setdefault("floor_marginal_us_per_written", {})[f"K={k} R={rate} {select}"] = r[
            "us_marginal_per_written"
        ]
        p = by.get((k, "proxy", rate, select))
        if p is not None and p["us_marginal_per_written"] is not None and r["us_marginal_per_written"] is not None:
            summary.setdefault("proxy_minus_floor_us_per_written", {})[f"K={k} R={rate} {select}"] = round(
                p["us_marginal_per_written"] - r["us_marginal_per_written"], 1
            )
    ks = sorted({r["K"] for r in writes if r["target"] == "proxy"})
    if len(ks) >= 2:
        flat = {}
        for rate in sorted({r["R"] for r in writes}):
            lo = by.get((ks[0], "proxy", rate, "watched"))
            hi = by.get((ks[-1], "proxy", rate, "watched"))
            if lo and hi and lo["us_marginal_per_written"] and hi["us_marginal_per_written"]:
                flat[f"R={rate}"] = round(hi["us_marginal_per_written"] / lo["us_marginal_per_written"], 2)
        summary[f"proxy_marginal_ratio_K{ks[-1]}_vs_K{ks[0]}"] = flat
    print("\nSummary:", json.dumps(summary, indent=1), flush=True)
    return summary


# ---------------------------------------------------------------- main


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    files = bl.ProductionFiles(any_delegated=args.upstream == "sim", any_tls=True)
    up = kc.kube_upstream() if args.upstream == "kube" else kc.sim_upstream(files)
    kmax = max(args.kubelet_list)
    layout = kc.Layout(
        prefix=args.prefix,
        nodes=kmax + args.spare_nodes,
        pods_per_node=args.pods_per_node,
        configmaps=args.configmaps,
    )
    rows: list[dict[str, Any]] = []
    writer = None
    fd, pods_path = tempfile.mkstemp(suffix=".json", prefix="bench-pods-")
    try:
        bl.log(f"seeding {layout} on {up.kind} at {up.url}")
        seeded = await kc.seed(up, layout)
        bl.log(f"seeded: {seeded}")
        if args.node_identities:
            t0 = time.monotonic()
            args.cert_dir = str(nodecerts.ensure_kit([layout.node(i) for i in range(kmax)]))
            bl.log(f"{kmax} node certificates in {args.cert_dir} ({time.monotonic() - t0:.1f} s)")
        with os.fdopen(fd, "w") as f:
            json.dump(layout.pods(), f)
        for k in args.kubelet_list if args.connect_only else ():
            for target in args.target_list:
                await measure_target(args, up, layout, files, k, target, None, rows)
        created_nodes = seeded["created"] and len(seeded["created"]) and seeded["reused"]["nodes"] < layout.nodes
        if not args.connect_only:
            await wait_nodes_quiet(up, layout, time.monotonic() if created_nodes else None)
            writer = await bl.Helper.start(
                "pod-writer",
                "--target",
                up.url,
                "--token",
                up.token,
                "--ca",
                up.ca,
                "--pods",
                pods_path,
                "--connections",
                str(args.writer_connections),
            )
            bl.log(f"writer: {await writer.recv()}")
            for k in args.kubelet_list:
                for target in args.target_list:
                    await measure_target(args, up, layout, files, k, target, writer, rows)
        summary = report(rows, up)
        bl.bench_line(
            "kubelets",
            {
                "machine": info,
                "upstream": up.kind,
                "layout": layout.__dict__,
                "args": {k: v for k, v in vars(args).items() if not k.endswith("_list")},
                "summary": summary,
                "rows": rows,
                "loadavg_at_end": loadavg(),
            },
        )
    finally:
        if writer is not None:
            await writer.close()
        with contextlib.suppress(OSError):
            os.unlink(pods_path)
        if not args.keep and up.kind == "kube":  # the sim goes with its objects
            bl.log(f"cleanup: {await kc.cleanup(up, layout)}")
        up.stop()
        files.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--upstream", choices=("kube", "sim"), default="kube" if os.environ.get("KUBE_REFERENCE_URL") else "sim"
    )
    p.add_argument("--quick", action="store_true", help="K=50,100; 20 and 50 writes/s; short windows")
    p.add_argument("--kubelets", default="1000,2000,5000", help="K values (comma-separated)")
    p.add_argument("--spare-nodes", type=int, default=100, help="Nodes no kubelet watches (for --select unwatched)")
    p.add_argument("--pods-per-node", type=int, default=4)
    p.add_argument("--configmaps", type=int, default=1000)
    p.add_argument("--cm-per-kubelet", type=int, default=5)
    p.add_argument("--rates", default="100,500", help="pod updates per second (comma-separated)")
    p.add_argument("--select", default="watched,unwatched", help="which pods the writer updates")
    p.add_argument(
        "--targets",
        default="proxy,upstream",
        help="comma-separated, measured in this order: proxy, upstream, floor (loadtest.bench.relay_floor)",
    )
    p.add_argument("--window", type=float, default=20.0, help="seconds of writing per rate")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement after connecting")
    p.add_argument("--drain", type=float, default=2.0, help="seconds after the writes before counting")
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for every watch to open (those refused keep retrying)",
    )
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--writer-connections", type=int, default=16)
    p.add_argument("--h2", action="store_true", help="one HTTP/2 connection per kubelet (the proxy gets --http2)")
    p.add_argument("--accept", choices=("protobuf", "json"), default="protobuf")
    p.add_argument("--watch-timeout", type=float, default=300.0, help="timeoutSeconds in [T, 2T), as client-go")
    p.add_argument("--source-addresses", type=int, default=1, help="spread kubelets over N loopback addresses")
    p.add_argument("--authentication", choices=bl.AUTH_MODES, default="delegated")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--proxy-args", default="", help="extra flags for watchcache serve")
    p.add_argument("--floor-args", default="", help="extra flags for relay_floor (e.g. --parse find)")
    p.add_argument("--profile", action="store_true", help="py-spy the proxy (or the floor) during each write window")
    p.add_argument("--profile-dir", default="/tmp/watchcache-bench")
    p.add_argument("--prefix", default="i25", help="names of this run's objects (the kit is shared)")
    p.add_argument(
        "--node-identities",
        action="store_true",
        help="each kubelet authenticates as its node (system:node:<node>, system:nodes) by a client certificate",
    )
    p.add_argument("--connect-only", action="store_true", help="the connect burst and idle phase only, no writes")
    p.add_argument("--keep", action="store_true", help="keep the objects for the next run")
    args = p.parse_args(argv)
    if args.quick:
        args.kubelets, args.rates, args.window, args.idle, args.spare_nodes = "50,100", "20,50", 8.0, 5.0, 20
        args.configmaps = 100
    args.kubelet_list = [int(x) for x in args.kubelets.split(",")]
    args.rate_list = [] if args.connect_only else [int(x) for x in args.rates.split(",")]
    args.select_list = args.select.split(",")
    args.target_list = args.targets.split(",")
    unknown = set(args.target_list) - {"proxy", "upstream", "floor"}
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    args.cert_dir = ""  # set by amain with --node-identities
    if args.node_identities and args.upstream != "kube":
        p.error("--node-identities needs kube-apiserver (--upstream kube): its Node authorizer and CA")
    if args.h2 and "floor" in args.target_list:
        p.error("the floor serves HTTP/1.1 only: drop --h2 or the floor target")
    bl.raise_nofile()
    import uvloop

    uvloop.run(amain(args))


if __name__ == "__main__":
    main()

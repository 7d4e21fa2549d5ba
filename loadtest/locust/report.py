"""Reading a run's locust CSVs: the printed summary and the PNG of latency and throughput.

Files of a run with ``--csv PREFIX --csv-full-history``: ``PREFIX_stats.csv`` (one row per
request type and name, whole run), ``PREFIX_stats_history.csv`` (every second, one row per name:
cumulative counts and the percentiles of the last ~10 s), ``PREFIX_failures.csv``, and this load
test's ``PREFIX_extras.json`` (exact latency percentiles, counters, server counters, the storm).

Locust keeps response times below 100 ms rounded to whole milliseconds, so its delivery-latency
percentiles are ±0.5 ms; the extras file has the exact ones.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.locust.serverstats import delta

TIMED_EVENTS = ("ADDED", "MODIFIED", "DELETED")
WRITE_TYPES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Row:
    type: str
    name: str
    requests: int
    failures: int
    rps: float
    p50: float | None
    p95: float | None
    p99: float | None

    @property
    def label(self) -> str:
        return f"{self.type} {self.name}".strip()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "N/A"


def read_stats(prefix: Path) -> list[Row]:
    rows = []
    with open(f"{prefix}_stats.csv", newline="") as f:
        for r in csv.DictReader(f):
            rows.append(
                Row(
                    r["Type"],
                    r["Name"],
                    int(r["Request Count"]),
                    int(r["Failure Count"]),
                    float(r["Requests/s"]),
                    _number(r["50%"]),
                    _number(r["95%"]),
                    _number(r["99%"]),
                )
            )
    return rows


def read_extras(prefix: Path) -> dict[str, Any]:
    path = Path(f"{prefix}_extras.json")
    return json.loads(path.read_text()) if path.exists() else {}


def read_failures(prefix: Path) -> list[dict[str, str]]:
    path = Path(f"{prefix}_failures.csv")
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@dataclass
class Figures:
    """What the summary states and the tests assert."""

    requests: int
    failures: int
    list_rps: float
    get_rps: float
    write_rps: float
    events: int  # ADDED/MODIFIED/DELETED delivered live (initial state and replayed history excluded)
    events_rps: float
    replayed: int  # timed events written before their stream was requested
    initial_events: int
    bookmarks: int


def figures(rows: list[Row]) -> Figures:
    body = [r for r in rows if r.name != "Aggregated"]
    total = next((r for r in rows if r.name == "Aggregated"), None)
    events = [r for r in body if r.type == "WATCH" and r.name in TIMED_EVENTS]
    return Figures(
        requests=total.requests if total else sum(r.requests for r in body),
        failures=total.failures if total else sum(r.failures for r in body),
        list_rps=sum(r.rps for r in body if r.type == "LIST"),
        get_rps=sum(r.rps for r in body if r.type == "GET"),
        write_rps=sum(r.rps for r in body if r.type in WRITE_TYPES),
        events=sum(r.requests for r in events),
        events_rps=sum(r.rps for r in events),
        replayed=sum(r.requests for r in body if r.type == "WATCH" and r.name.endswith("(replayed)")),
        initial_events=sum(r.requests for r in body if r.type == "WATCH" and r.name.endswith("(initial)")),
        bookmarks=sum(r.requests for r in body if r.type == "WATCH" and r.name.startswith("BOOKMARK")),
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value < 10 else f"{value:.0f}"


def summary(prefix: Path, header: str = "") -> str:
    rows = read_stats(prefix)
    extras = read_extras(prefix)
    fig = figures(rows)
    lines = [header] if header else []
    lines.append(f"requests {fig.requests}, failures {fig.failures}")
    lines.append(
        f"LIST {fig.list_rps:.1f}/s, GET {fig.get_rps:.1f}/s, writes {fig.write_rps:.1f}/s "
        f"(through the {extras.get('writes_via', '?')})"
    )
    lines.append(f"  {'request':<56} {'count':>6} {'rate':>8}   p50   p95   p99 (ms)")
    for kind in ("LIST", "GET"):
        for r in sorted((r for r in rows if r.type == kind), key=lambda r: -r.requests):
            failed = f"  {r.failures} FAILED" if r.failures else ""
            times = f"{_ms(r.p50):>5} {_ms(r.p95):>5} {_ms(r.p99):>5}"
            lines.append(f"  {r.label:<56} {r.requests:>6} {r.rps:>6.1f}/s {times}{failed}")
    lines.append(
        f"watch events delivered: {fig.events} ({fig.events_rps:.1f}/s); also {fig.replayed} replayed from "
        f"history, {fig.initial_events} initial-state events, {fig.bookmarks} bookmarks"
    )
    latency = extras.get("delivery_latency_ms", {})
    for kind in (*TIMED_EVENTS, "all", "replayed"):
        exact = latency.get(kind)
        row = next((r for r in rows if r.type == "WATCH" and r.name == kind), None)
        received = row.requests if row else {"all": fig.events, "replayed": fig.replayed}.get(kind, 0)
        if not received:
            continue
        text = f"  delivery latency {kind:<8} {received:>6} events"
        if exact:
            text += (
                f", {exact['count']:>6} timed: p50 {_ms(exact['p50'])} p95 {_ms(exact['p95'])} "
                f"p99 {_ms(exact['p99'])} max {_ms(exact['max'])} ms"
            )
        else:
            text += ", none timed (no stamp: not written by the ChurnUser)"
        lines.append(text)
    counters = extras.get("counters", {})
    if counters:
        lines.append("client counters: " + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())))
    server = extras.get("server_counters", {})
    lines.extend(_server_lines(server.get("before"), server.get("after")))
    storm = extras.get("storm") or {}
    if storm:
        lines.extend(storm_lines(storm))
    cpu = extras.get("locust_cpu_percent") or {}
    if cpu.get("mean") is not None:
        warn = " (locust warned: CPU-bound, latencies include its scheduling delay)" if cpu.get("warning") else ""
        lines.append(f"locust CPU: mean {cpu['mean']}%, max {cpu['max']}% of one core{warn}")
    for f in read_failures(prefix)[:10]:
        lines.append(
            f"  failure x{f.get('Occurrences')}: {f.get('Method')} {f.get('Name')}: {f.get('Error', '')[:160]}"
        )
    return "\n".join(lines)


def _passed(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _server_lines(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    lines = []
    if before and after:
        up = delta(before.get("upstream"), after.get("upstream"))
        if up is not None:
            lines.append(
                f"upstream during the run: {up['watch_requests']} WATCH requests, open watches "
                f"{up['watchers'][0]} -> {up['watchers'][1]}, other requests it served: "
                f"{_passed(up['passed_through'])}; {up['list_requests']} LIST requests served from its storage"
            )
        proxy = delta(before.get("proxy"), after.get("proxy"))
        if proxy is not None:
            lines.append(
                f"proxy (one worker's counters if it runs several): {proxy['watch_requests']} client WATCH "
                f"requests, passed through: {_passed(proxy['passed_through'])}"
            )
    return lines


def storm_lines(storm: dict[str, Any]) -> list[str]:
    up = storm.get("upstream_delta")
    proxy = storm.get("proxy_delta")
    lines = [
        f"relist storm: {storm['informers_restarted']} informers restarted at once; "
        f"{storm['informer_lists_started']} relists (LIST rv=0 limit=500) through the proxy, all watching again "
        f"after {storm['seconds_to_resync']} s ({storm['informers_watching_again']}/{storm['informers']})"
    ]
    if up is not None:
        lines.append(
            f"  upstream over the storm's {storm['window_seconds']} s: +{up['watch_requests']} WATCH requests "
            f"(open watches {up['watchers'][0]} -> {up['watchers'][1]}), +{up['list_requests']} LIST requests"
        )
    else:
        lines.append("  upstream counters: unavailable (no --upstream-host, or it has no /debug/cache)")
    if proxy is not None:
        passed = ", ".join(f"{k} {v}" for k, v in proxy["passed_through"].items()) or "none"
        lines.append(
            f"  proxy over the storm: {proxy['watch_requests']} client WATCH requests; passed through: {passed}"
        )
    return lines


# ---------------------------------------------------------------------------------------- plot


def read_history(prefix: Path) -> dict[tuple[str, str], list[dict[str, str]]]:
    by_name: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    with open(f"{prefix}_stats_history.csv", newline="") as f:
        for r in csv.DictReader(f):
            by_name[(r["Type"], r["Name"])].append(r)
    return by_name


def _rates(history: list[dict[str, str]], t0: float) -> tuple[list[float], list[float]]:
    """Per-interval rates from the cumulative counts (exact, unlike locust's smoothed Requests/s)."""
    xs, ys = [], []
    previous: tuple[float, int] | None = None
    for r in history:
        t, n = float(r["Timestamp"]), int(r["Total Request Count"])
        if previous is not None and t > previous[0]:
            xs.append(t - t0)
            ys.append((n - previous[1]) / (t - previous[0]))
        previous = (t, n)
    return xs, ys


def _sum_series(series: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    total: dict[float, float] = defaultdict(float)
    for xs, ys in series:
        for x, y in zip(xs, ys, strict=True):
            total[x] += y
    keys = sorted(total)
    return keys, [total[k] for k in keys]


def label_log_axis(axis: Any) -> None:
    """Label a log y axis at 1, 2 and 5 per decade in plain numbers (0.5, 1, 2, 5, 10, 20 ms ...).

    matplotlib labels a log axis at powers of ten only, so latencies between 1 and 30 ms got two
    labels ("10^0", "10^1"). Over more than three decades, 1-2-5 would crowd the panel: every decade
    is labelled instead. Call it once the data are plotted (the span decides).
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = axis.get_ylim()
    decades = math.log10(high / low) if low > 0 and high > low else 0.0
    axis.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3.2 else (1.0,)))
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axis.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(i) for i in range(1, 10))))
    axis.yaxis.set_minor_formatter(NullFormatter())


def plot(prefix: Path, out: Path, title: str) -> Path:
    """Three panels over time: delivery latency percentiles per event type, events delivered per
    second (with the writes sent), LIST/GET requests per second with the user count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = read_history(prefix)
    aggregated = history.get(("", "Aggregated"), [])
    if not aggregated:
        raise ValueError("empty stats history")
    t0 = float(aggregated[0]["Timestamp"])
    fig, (lat, thr, reads) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    colors = {"ADDED": "tab:green", "MODIFIED": "tab:blue", "DELETED": "tab:red"}
    for kind in TIMED_EVENTS:
        rows = [r for r in history.get(("WATCH", kind), []) if _number(r["50%"]) is not None]
        if not rows:
            continue
        xs = [float(r["Timestamp"]) - t0 for r in rows]
        for pct, style in (("50%", "-"), ("95%", ":"), ("99%", "--")):
            # Locust rounds to whole ms: draw "0" (under 0.5 ms) at 0.5 so the log axis keeps it.
            ys = [max(0.5, _number(r[pct]) or 0.0) for r in rows]
            lat.plot(xs, ys, style, color=colors[kind], label=f"{kind} p{pct[:-1]}")
    lat.set_yscale("log")
    label_log_axis(lat)
    lat.set_ylabel("delivery latency (ms, log)\npercentiles of the last ~10 s")
    lat.set_title(title)
    lat.legend(ncol=3, fontsize=8)
    lat.grid(alpha=0.3)

    for kind in TIMED_EVENTS:
        if ("WATCH", kind) in history:
            thr.plot(*_rates(history[("WATCH", kind)], t0), color=colors[kind], label=kind)
    others = [
        _rates(rows, t0) for (typ, name), rows in history.items() if typ == "WATCH" and name.endswith("(initial)")
    ]
    if others:
        # Its own axis: a streaming list of every pod is a burst of thousands that would flatten the rest.
        initial = thr.twinx()
        initial.plot(*_sum_series(others), color="tab:gray", alpha=0.5, label="initial-state events (right axis)")
        initial.set_ylabel("initial-state events / s")
        initial.legend(loc="upper left", fontsize=8)
    replayed = [
        _rates(rows, t0) for (typ, name), rows in history.items() if typ == "WATCH" and name.endswith("(replayed)")
    ]
    if replayed:
        thr.plot(*_sum_series(replayed), color="tab:olive", label="replayed from history")
    writes = [_rates(rows, t0) for (typ, _), rows in history.items() if typ in WRITE_TYPES]
    if writes:
        thr.plot(*_sum_series(writes), color="black", linestyle="--", label="writes sent")
    thr.set_ylabel("events / s delivered\n(all watchers)")
    thr.legend(loc="upper right", fontsize=8)
    thr.grid(alpha=0.3)

    for kind, color in (("LIST", "tab:purple"), ("GET", "tab:orange")):
        series = [_rates(rows, t0) for (typ, _), rows in history.items() if typ == kind]
        if series:
            reads.plot(*_sum_series(series), color=color, label=f"{kind} requests/s")
    reads.set_ylabel("requests / s")
    users = reads.twinx()
    users.plot(
        [float(r["Timestamp"]) - t0 for r in aggregated],
        [int(r["User Count"]) for r in aggregated],
        color="tab:gray",
        linestyle=":",
        label="users",
    )
    users.set_ylabel("users")
    reads.legend(loc="upper left", fontsize=8)
    users.legend(loc="upper right", fontsize=8)
    reads.grid(alpha=0.3)
    reads.set_xlabel("seconds since start")
    storm_at = (read_extras(prefix).get("storm") or {}).get("at")
    if storm_at:
        for axis in (lat, thr, reads):
            axis.axvline(float(storm_at) - t0, color="black", alpha=0.4, linewidth=1)
        thr.annotate("relist storm", (float(storm_at) - t0, 0), xytext=(4, 4), textcoords="offset points", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

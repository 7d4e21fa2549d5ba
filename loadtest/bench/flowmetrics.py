"""API Priority and Fairness as a server's ``/metrics`` tell it: what a burst was classified as, waited and was refused.

The proxy and kube-apiserver export the same series (kube's names and labels), so one reader serves
both: ``snapshot`` before and after a phase, ``delta`` between them, ``summary`` per priority level
and flow schema (dispatched, refused by reason, mean and maximal-bucket wait).
"""

from __future__ import annotations

import re
from typing import Any

from loadtest.bench.kubeclient import Collect, Target

_SERIES = (
    "apiserver_flowcontrol_dispatched_requests_total",
    "apiserver_flowcontrol_rejected_requests_total",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum",
    "apiserver_flowcontrol_request_wait_duration_seconds_count",
)
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Key, float]:
    """The flow-control series of a Prometheus text exposition: (name, sorted labels) → value."""
    out: dict[Key, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_flowcontrol_"):
            continue
        m = _LINE.match(line)
        if m is None or m.group(1) not in _SERIES:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2))))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


async def snapshot(url: str, token: str, ca: str = "") -> dict[Key, float]:
    """The server's flow-control counters now (empty if ``/metrics`` cannot be read)."""
    target = Target(url, token, ca)
    conn = await target.connect()
    try:
        sink = Collect()
        conn.request("GET", "/metrics", sink, accept="text/plain")
        await sink.done
    finally:
        conn.close()
    if sink.status != 200:
        return {}
    return parse(sink.body.decode("utf-8", "replace"))


def delta(before: dict[Key, float], after: dict[Key, float]) -> dict[Key, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def summary(d: dict[Key, float], schemas: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per ``priority_level/flow_schema`` (only ``schemas`` if given): dispatched, rejected by reason,
    mean wait in ms of the dispatched (``execute="true"``) ones."""
    rows: dict[str, dict[str, Any]] = {}
    for (name, labels), v in d.items():
        lab = dict(labels)
        schema = lab.get("flow_schema", "")
        if schemas and schema not in schemas:
            continue
        row = rows.setdefault(f"{lab.get('priority_level', '')}/{schema}", {})
        if name.endswith("dispatched_requests_total"):
            row["dispatched"] = row.get("dispatched", 0) + int(v)
        elif name.endswith("rejected_requests_total"):
            rejected = row.setdefault("rejected", {})
            rejected[lab.get("reason", "")] = rejected.get(lab.get("reason", ""), 0) + int(v)
        elif lab.get("execute", "true") == "true":
            key = "wait_sum" if name.endswith("_sum") else "wait_count"
            row[key] = row.get(key, 0.0) + v
    for row in rows.values():
        total, count = row.pop("wait_sum", 0.0), row.pop("wait_count", 0.0)
        row["wait_mean_ms"] = round(total / count * 1000, 2) if count else None
    return dict(sorted(rows.items()))

"""What ``/debug/cache`` and ``/readyz?verbose`` say: the whole process group, whichever worker answers.

Each worker describes itself (``local_status``): its caches (the ones it owns and its follower
replicas of the others'), their readiness, the last failure of the upstream requests it makes, its
pass-through counts and its local readiness checks. The worker that answers asks every other worker
for theirs over the shard sockets (as ``/metrics`` does) and ``merge`` makes one view: per resource,
the owner's data, the watchers of every worker, each replica's state, and the owner's last upstream
failure. Without workers the group is the process itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from watchcache.resources import ResourceType
from watchcache.server.context import ApiContext


def local_status(
    ctx: ApiContext,
    *,
    worker: int | None,
    owns: Callable[[ResourceType], bool],
    passed_through: dict[str, int],
    inflight: int,
    checks: Iterable[tuple[bool, str]],
    caching: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """This process's part (JSON-able): caches by resource, failures, counts, readiness checks, and
    ``caching``: the kinds reads started (or ``--resources all``), why and in which state."""
    failures = ctx.upstream_failures
    now = time.time()
    resources: dict[str, Any] = {}
    for resource, cacher in list(ctx.cachers.items()):
        stats = dataclasses.asdict(cacher.cache.stats())
        stats["watchers"] = len(cacher.dispatcher)
        stats["watch_requests"] = cacher.watch_requests
        stats["list_requests"] = cacher.lists
        stats["list_requests_shared"] = cacher.list_bodies.shared
        stats["ready"] = cacher.serving  # a suspended JSON feed is served by the protobuf cache
        stats["state"] = cacher.state.value
        stats["role"] = "owner" if owns(resource) else "follower"
        failure = failures.for_resource(resource) if failures is not None else None
        stats["last_upstream_error"] = failure.as_json(now) if failure is not None else None
        stats["upstream_failing"] = failures is not None and resource in failures.failing
        resources[resource.path_id()] = stats  # versioned: two served versions of a kind are two caches
    protobuf: dict[str, Any] = {}
    for cacher in list(ctx.more_cachers()):  # the protobuf caches (upstream/protobuf.py) and their followers
        stats = dataclasses.asdict(cacher.cache.stats())
        stats["watchers"] = len(cacher.dispatcher)
        stats["ready"] = cacher.ready
        stats["role"] = "owner" if owns(cacher.resource) else "follower"
        protobuf[cacher.resource.path_id()] = stats
    discovery = failures.for_resource(None) if failures is not None else None
    return {
        "worker": worker,
        "resources": resources,
        "protobuf": protobuf,
        "passed_through": dict(passed_through),
        "inflight": inflight,
        "discovered": ctx.discovered,
        "discovery_error": discovery.as_json(now) if discovery is not None else None,
        "discovery_failing": failures is not None and None in failures.failing,
        "upstream": ctx.upstream_description,
        "checks": [[ok, line] for ok, line in checks],
        "caching": caching,
    }


def _worker_name(status: dict[str, Any]) -> str:
    return "" if status.get("worker") is None else f"worker {status['worker']}"


def merge(statuses: list[dict[str, Any]], workers: int = 1) -> dict[str, Any]:
    """One ``/debug/cache`` view of the group: per resource the owner's data (objects, bytes, history,
    readiness, last upstream failure), every worker's watchers and requests added up, and each
    replica's state."""
    summed = ("watchers", "watch_requests", "list_requests")
    resources: dict[str, Any] = {}
    data: dict[str, tuple[dict[str, Any], int | None]] = {}
    passed: dict[str, int] = {}
    inflight = 0
    for status in statuses:
        worker = status.get("worker") or 0
        inflight += status["inflight"]
        for reason, count in status["passed_through"].items():
            passed[reason] = passed.get(reason, 0) + count
        for name, stats in status["resources"].items():
            entry = resources.setdefault(name, {"replicas": {}, **dict.fromkeys(summed, 0)})
            entry["replicas"][str(worker)] = {k: stats[k] for k in ("role", "ready", "rv", "objects", "watchers")}
            for k in summed:
                entry[k] += stats[k]
            if stats["role"] == "owner" or name not in data:
                data[name] = (stats, worker if stats["role"] == "owner" else None)
    for name, entry in resources.items():
        stats, owner = data[name]
        own = {k: v for k, v in stats.items() if k not in summed and k != "role"}
        resources[name] = {**own, **entry, "owner": owner}
    for name, entry in _merge_protobuf(statuses).items():
        if name in resources:  # (its owner answered: the JSON cache is always there)
            resources[name]["protobuf"] = entry
    discovery = [s["discovery_error"] for s in statuses if s.get("discovery_error")]
    caching = _merged_caching(statuses)
    for name, entry in resources.items():
        kind = caching["kinds"].get(name) if caching else None
        entry["cached_because"] = kind["why"] if kind else "--resources"
    return {
        "workers": workers,
        "answered": sorted(s.get("worker") or 0 for s in statuses),
        "upstream": next((s["upstream"] for s in statuses if s.get("upstream")), ""),
        "resources": dict(sorted(resources.items())),
        "passed_through": passed,
        "inflight": inflight,
        "discovery_error": max(discovery, key=lambda d: d["time"]) if discovery else None,
        "caching": caching,
    }


def _merged_caching(statuses: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The kinds reads started, in the group: each kind as its owner says (else a follower), counts summed."""
    parts = [s["caching"] for s in statuses if s.get("caching")]
    if not parts:
        return None
    kinds: dict[str, Any] = {}
    for part in parts:
        for name, kind in part["kinds"].items():
            if name not in kinds or kind["role"] == "owner":
                kinds[name] = kind
    stopped: dict[str, int] = {}
    for part in parts:
        for reason, count in part["stopped"].items():
            stopped[reason] = stopped.get(reason, 0) + count
    return {
        "on_demand": parts[0]["on_demand"],
        "idle": parts[0]["idle"],
        "kinds": dict(sorted(kinds.items())),
        "started": sum(p["started"] for p in parts),
        "stopped": stopped,
        "passed_through_syncing": sum(p["passed_through_syncing"] for p in parts),
        # --cache-memory-bytes is per worker: the budget of one, the bytes and refusals of all.
        "memory_budget_bytes": parts[0].get("memory_budget_bytes", 0),
        "accounted_bytes": sum(p.get("accounted_bytes", 0) for p in parts),
        "over_budget": sorted({k for p in parts for k in p.get("over_budget", ())}),
        "refused_over_budget": sum(p.get("refused_over_budget", 0) for p in parts),
    }


def _merge_protobuf(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """Per resource, its protobuf cache: the owner's objects, bytes and history, every worker's
    watchers added up, and each replica (the owner's cache, followers of it in other workers)."""
    merged: dict[str, Any] = {}
    for status in statuses:
        worker = str(status.get("worker") or 0)
        for name, stats in (status.get("protobuf") or {}).items():
            entry = merged.setdefault(name, {"watchers": 0, "replicas": {}})
            entry["watchers"] += stats["watchers"]
            entry["replicas"][worker] = {k: stats[k] for k in ("role", "ready", "rv", "objects", "watchers")}
            if stats["role"] == "owner" or "objects" not in entry:
                entry.update({k: v for k, v in stats.items() if k not in ("watchers", "role")})
    return dict(sorted(merged.items()))


def _failure_text(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    hint = f" ({error['hint']})" if error.get("hint") else ""
    return f"last upstream error {error['seconds_ago']:.0f}s ago, {error['verb']}: {error['message']}{hint}"


def readiness_lines(statuses: list[dict[str, Any]], workers: int, local_checks: Iterable[str]) -> list[str]:
    """``/readyz?verbose``: a line per cached resource (its owner's sync, and any replica that has not
    synced), the upstream and its last failures, then this worker's own checks."""
    lines: list[str] = []
    answered = {s.get("worker") or 0 for s in statuses}
    by_resource: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for status in statuses:
        for name, stats in status["resources"].items():
            by_resource.setdefault(name, []).append((status, stats))
    caching = _merged_caching(statuses)
    started = caching["kinds"] if caching else {}
    for name in sorted(by_resource):
        replicas = sorted(by_resource[name], key=lambda p: p[1]["role"] != "owner")
        for status, stats in replicas:
            owner = stats["role"] == "owner"
            if not owner and stats["ready"]:
                continue  # a synced follower replica says nothing the owner's line does not
            where = "" if workers == 1 else f" ({_worker_name(status)}{'' if owner else ' replica'})"
            failing = stats.get("upstream_failing")
            if stats["ready"]:
                detail = "ok" if name not in started else f"ok ({started[name]['why']})"
                if failing:
                    detail += f"; {_failure_text(stats['last_upstream_error'])}"
                lines.append(f"[+]cache-synced:{name}{where} {detail}")
            else:
                detail = "failed: not synced"
                if stats.get("last_upstream_error"):
                    detail += f"; {_failure_text(stats['last_upstream_error'])}"
                lines.append(f"[-]cache-synced:{name}{where} {detail}")
    for name, kind in started.items():
        if name in by_resource and kind["state"] == "cached":
            continue  # its cache-synced line says it
        # Never failed: readiness does not wait for a kind a read started (or --resources all's).
        failure = kind.get("last_upstream_error")
        detail = f"; {_failure_text(failure)}" if failure else ""
        lines.append(f"[+]cache-{kind['state']}:{name} ({kind['why']}, {kind['seconds']:.0f}s){detail}")
    missing = sorted(set(range(workers)) - answered)
    if missing:
        lines.append(f"[-]workers-answered failed: workers {missing} did not answer")
    upstream = next((s["upstream"] for s in statuses if s.get("upstream")), "")
    if upstream:
        failing = [s for s in statuses if s.get("discovery_failing")]
        if failing:
            lines.append(f"[-]upstream-discovery failed: {upstream}; {_failure_text(failing[0]['discovery_error'])}")
        elif all(s.get("discovered", True) for s in statuses):
            lines.append(f"[+]upstream ok: {upstream}")
        else:
            lines.append(f"[-]upstream-discovery failed: {upstream}: discovery has not answered yet")
    lines.extend(local_checks)
    return lines

"""Counters read from watchcache's own endpoints: ``/debug/cache`` on the proxy and on the
simulated cluster (the upstream), and the proxy's pass-through counters in ``/metrics``.

On the simulated cluster, ``watchers`` per resource is the number of open watches on it (the
proxy's reflectors, its consistent-read probes, any direct client) and ``watch_requests`` the
cumulative count of WATCH requests it served. It exposes no LIST counter, so upstream LISTs
(the proxy's relists and its ``limit=1`` freshness reads) cannot be counted from here.

Plain urllib, no gevent import: run.py uses it outside locust, and inside locust gevent's monkey
patching makes it cooperative.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any


def fetch_json(base_url: str, path: str, token: str = "", timeout: float = 5.0) -> dict[str, Any] | None:
    """GET a JSON document, or None if the server does not have it (e.g. a real apiserver)."""
    context = ssl._create_unverified_context() if base_url.startswith("https") else None
    try:
        request = urllib.request.Request(base_url.rstrip("/") + path, headers={"Accept": "application/json"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def cache_counters(base_url: str, token: str = "") -> dict[str, Any] | None:
    """``/debug/cache`` summed over resources: watchers, watch_requests, plus passed_through."""
    doc = fetch_json(base_url, "/debug/cache", token)
    if doc is None or "resources" not in doc:
        return None
    resources = doc["resources"]
    return {
        "watchers": sum(r.get("watchers", 0) for r in resources.values()),
        "watch_requests": sum(r.get("watch_requests", 0) for r in resources.values()),
        "list_requests": sum(r.get("list_requests", 0) for r in resources.values()),
        "per_resource": {
            name: {"watchers": r.get("watchers", 0), "watch_requests": r.get("watch_requests", 0)}
            for name, r in resources.items()
            if r.get("watch_requests") or r.get("watchers")
        },
        "passed_through": dict(doc.get("passed_through", {})),
    }


def snapshot(proxy_url: str, upstream_url: str, token: str = "") -> dict[str, Any]:
    return {
        "proxy": cache_counters(proxy_url, token) if proxy_url else None,
        "upstream": cache_counters(upstream_url, token) if upstream_url else None,
    }


def delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """after - before for the cumulative counters; the gauge ``watchers`` as before → after."""
    if not before or not after:
        return None
    passed = {
        reason: after["passed_through"].get(reason, 0) - before["passed_through"].get(reason, 0)
        for reason in set(before["passed_through"]) | set(after["passed_through"])
    }
    return {
        "watch_requests": after["watch_requests"] - before["watch_requests"],
        "list_requests": after.get("list_requests", 0) - before.get("list_requests", 0),
        "watchers": [before["watchers"], after["watchers"]],
        "passed_through": {k: v for k, v in sorted(passed.items()) if v},
    }

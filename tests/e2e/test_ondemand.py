"""On-demand caching through real processes: the simulated cluster, a proxy with --resources pods, and
HTTP. Every other kind the sim serves is cached from its first read (service/ondemand.py)."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.processes import Stack, start, start_stack, wait_ready
from harness.waiting import wait_until
from tests.support.httpkube import WatchStream, call, cm_path, configmap, get, get_ok, path_with, request, write

CONFIGMAPS = "/api/v1/configmaps"
DEPLOYMENTS = "/apis/apps/v1/deployments"
SIM = ("--objects", "20", "--namespaces", "2")
POLICY = str(Path(__file__).resolve().parents[2] / "watchcache/sim/policy-example.yaml")


def debug_cache(url: str) -> dict[str, Any]:
    return get_ok(url, "/debug/cache")


def uncached(url: str) -> int:
    return int(debug_cache(url)["passed_through"].get("uncached-resource", 0))


def state(url: str, name: str) -> str | None:
    kind = debug_cache(url)["caching"]["kinds"].get(name)
    return kind["state"] if kind else None


def synced(proxy: str, name: str) -> None:
    """Wait until the kind a read started has synced (from then on its reads are the cache's)."""
    wait_until(lambda: state(proxy, name) == "cached", timeout=10.0)


@pytest.fixture
def stack() -> Iterator[Stack]:
    # An idle time no pause of a loaded test machine reaches: only the tests of idleness stop caches.
    s = start_stack("--resources", "pods", "--workers", "1", "--cache-idle", "60", sim_args=SIM)
    yield s
    s.proxy.stop()
    s.sim.stop()


@pytest.fixture
def idle_stack() -> Iterator[Stack]:
    s = start_stack("--resources", "pods", "--workers", "1", "--cache-idle", "2", sim_args=SIM)
    yield s
    s.proxy.stop()
    s.sim.stop()


def test_a_kinds_first_read_starts_its_cache_and_later_reads_are_served_from_it(stack: Stack) -> None:
    proxy, sim = stack.proxy.url, stack.sim.url
    before = debug_cache(proxy)
    assert set(before["resources"]) == {"pods"}, "nothing but --resources is cached before a read"
    assert get_ok(proxy, CONFIGMAPS) == get_ok(sim, CONFIGMAPS)  # the first read: passed through
    assert uncached(proxy) == 1
    synced(proxy, "configmaps")
    for _ in range(5):
        through = get_ok(proxy, CONFIGMAPS)
        assert through == get_ok(sim, CONFIGMAPS)
    assert uncached(proxy) == 1, "served from the cache once synced"
    view = debug_cache(proxy)
    assert view["resources"]["configmaps"]["cached_because"] == "on demand"
    assert view["resources"]["pods"]["cached_because"] == "--resources"
    kind = view["caching"]["kinds"]["configmaps"]
    assert kind["why"] == "on demand" and kind["sync_seconds"] is not None and kind["sync_seconds"] < 5.0
    readyz = get(proxy, "/readyz?verbose").body.decode()
    assert "[+]cache-synced:configmaps ok (on demand)" in readyz, readyz


def test_a_watch_of_an_on_demand_kind_sees_writes_and_keeps_it_cached(idle_stack: Stack) -> None:
    stack = idle_stack
    proxy, sim = stack.proxy.url, stack.sim.url
    get_ok(proxy, CONFIGMAPS)
    synced(proxy, "configmaps")
    listed = get_ok(proxy, cm_path("ns-1"))
    query = path_with(cm_path("ns-1"), watch=1, resourceVersion=listed["metadata"]["resourceVersion"])
    with WatchStream(proxy, query) as stream:
        passed = uncached(proxy)
        created = write(sim, "POST", cm_path("ns-1"), configmap("od-watched", "ns-1"))
        event = stream.next()
        assert event is not None and event["type"] == "ADDED" and event["object"] == created
        assert uncached(proxy) == passed, "the watch was the cache's"
        # Longer than --cache-idle (2 s) plus a tick, with the watch open: not idle.
        time.sleep(3.5)
        assert state(proxy, "configmaps") == "cached"
        assert debug_cache(proxy)["caching"]["stopped"] == {}
        write(sim, "POST", cm_path("ns-1"), configmap("od-watched-2", "ns-1"))
        event = stream.next()
        assert event is not None and event["object"]["metadata"]["name"] == "od-watched-2"


def test_an_unread_kind_stops_and_a_read_starts_it_again_and_old_watches_resume(idle_stack: Stack) -> None:
    stack = idle_stack
    proxy, sim = stack.proxy.url, stack.sim.url
    get_ok(proxy, CONFIGMAPS)
    synced(proxy, "configmaps")
    old_rv = get_ok(proxy, CONFIGMAPS)["metadata"]["resourceVersion"]
    wait_until(lambda: "configmaps" not in debug_cache(proxy)["resources"], timeout=10.0)
    assert debug_cache(proxy)["caching"]["stopped"] == {"idle": 1}
    assert any("caching configmaps stopped (idle)" in line for line in stack.proxy.log)
    created = write(sim, "POST", cm_path("ns-0"), configmap("od-while-stopped", "ns-0"))
    get_ok(proxy, CONFIGMAPS)  # starts it again
    synced(proxy, "configmaps")
    # A watch from before the restart: the new cache's window starts later, and it backfills as a
    # cache started at start does (from the upstream), so the client sees the write it missed.
    with WatchStream(proxy, path_with(CONFIGMAPS, watch=1, resourceVersion=old_rv)) as stream:
        event = stream.next()
    assert event is not None and event["type"] == "ADDED", event
    assert event["object"] == created


def test_without_on_demand_or_excluded_a_kind_is_passed_through() -> None:
    for flags in (("--no-cache-on-demand",), ("--cache-exclude", "configmaps,apps/v1/deployments")):
        s = start_stack("--resources", "pods", "--workers", "1", *flags, sim_args=SIM)
        try:
            for _ in range(3):
                assert get_ok(s.proxy.url, CONFIGMAPS) == get_ok(s.sim.url, CONFIGMAPS)
                get_ok(s.proxy.url, DEPLOYMENTS)
            view = debug_cache(s.proxy.url)
            assert set(view["resources"]) == {"pods"}, flags
            assert view["passed_through"]["uncached-resource"] == 6, flags
        finally:
            s.proxy.stop()
            s.sim.stop()


def test_with_workers_a_kind_has_one_reflector_on_its_owner_and_followers_elsewhere() -> None:
    s = start_stack("--resources", "pods", "--workers", "2", sim_args=SIM)
    try:
        proxy, sim = s.proxy.url, s.sim.url
        # Fresh connections: SO_REUSEPORT spreads them, so both workers get reads.
        for _ in range(20):
            get_ok(proxy, CONFIGMAPS)
            get_ok(proxy, DEPLOYMENTS)

        def replicated() -> bool:
            view = debug_cache(proxy)
            return all(
                name in view["resources"] and len(view["resources"][name]["replicas"]) == 2
                for name in ("configmaps", "apps/v1/deployments")
            )

        wait_until(lambda: (get_ok(proxy, CONFIGMAPS), get_ok(proxy, DEPLOYMENTS)) and replicated(), timeout=15.0)
        view = debug_cache(proxy)
        for name in ("configmaps", "apps/v1/deployments"):
            roles = sorted(r["role"] for r in view["resources"][name]["replicas"].values())
            assert roles == ["follower", "owner"], (name, view["resources"][name])
        reflecting = [line for line in s.proxy.log if "its first read started a reflector" in line]
        assert len(reflecting) == 2, reflecting  # one per kind in the group
        passed = uncached(proxy)
        for _ in range(10):
            assert get_ok(proxy, CONFIGMAPS) == get_ok(sim, CONFIGMAPS)
        assert uncached(proxy) == passed
    finally:
        s.proxy.stop()
        s.sim.stop()


def test_without_authentication_secrets_are_not_cached_and_the_start_says_so(stack: Stack) -> None:
    proxy, sim = stack.proxy.url, stack.sim.url
    assert any("secrets pass through, never cached: --authentication none" in line for line in stack.proxy.log)
    for _ in range(3):
        assert get_ok(proxy, "/api/v1/secrets") == get_ok(sim, "/api/v1/secrets")
    view = debug_cache(proxy)
    assert "secrets" not in view["resources"] and "secrets" not in view["caching"]["kinds"]
    assert view["passed_through"]["uncached-resource"] == 3


def test_over_the_memory_budget_the_least_recently_read_kind_is_dropped_and_passed_through() -> None:
    s = start_stack(
        "--resources", "namespaces", "--workers", "1", "--cache-memory-bytes", "1000000",
        sim_args=("--objects", "200", "--namespaces", "2"),
    )  # fmt: skip
    try:
        proxy, sim = s.proxy.url, s.sim.url
        for i in range(100):  # ~4 KB each: ~0.5 MB cached with their overhead
            write(sim, "POST", cm_path("ns-0"), configmap(f"big-{i}", "ns-0", blob="x" * 4000))
        get_ok(proxy, CONFIGMAPS)
        synced(proxy, "configmaps")
        configmaps = debug_cache(proxy)["caching"]
        wait_until(lambda: debug_cache(proxy)["caching"]["kinds"]["configmaps"].get("accounted_bytes"), timeout=5.0)
        cm_bytes = debug_cache(proxy)["caching"]["kinds"]["configmaps"]["accounted_bytes"]
        assert 400_000 < cm_bytes < 1_000_000, configmaps
        # Pods (200 of ~3 KB) read later: together over the budget, so configmaps, read least recently, go.
        get_ok(proxy, "/api/v1/pods")
        wait_until(lambda: "configmaps" in debug_cache(proxy)["caching"]["over_budget"], timeout=10.0)
        view = debug_cache(proxy)
        assert "configmaps" not in view["resources"] and "pods" in view["resources"]
        assert view["caching"]["stopped"] == {"memory": 1}
        assert view["caching"]["accounted_bytes"] <= 1_000_000
        assert any("caching configmaps stopped: over --cache-memory-bytes" in line for line in s.proxy.log)
        metrics = get(proxy, "/metrics").body.decode()
        assert 'watchcache_caches_stopped_total{reason="memory"} 1.0' in metrics
        # It does not fit back while pods are cached: its reads pass through, answered as the upstream's.
        passed = uncached(proxy)
        assert get_ok(proxy, CONFIGMAPS)["items"] == get_ok(sim, CONFIGMAPS)["items"]
        assert uncached(proxy) == passed + 1
        assert "configmaps" not in debug_cache(proxy)["resources"]
    finally:
        s.proxy.stop()
        s.sim.stop()


def test_a_kind_the_proxy_may_not_list_is_reported_and_passed_through_and_blocks_nothing(tmp_path: Path) -> None:
    # The proxy's own identity is alice (pods and configmaps only): nodes, read by the admin, cannot be cached.
    token = tmp_path / "token"
    token.write_text("alice-token")
    sim = start("sim", "--objects", "20", "--namespaces", "2", "--policy-file", POLICY)
    try:
        proxy = start(
            "serve", "--upstream", sim.url, "--token-file", str(token), "--authentication", "delegated",
            "--resources", "pods", "--workers", "1",
        )  # fmt: skip
        try:
            wait_ready(proxy)
            for _ in range(3):
                assert call(proxy.url, "/api/v1/nodes", "admin-token")[0] == 200  # the upstream's answer
                assert call(proxy.url, "/api/v1/configmaps", "admin-token")[0] == 200

            def reported() -> str:
                status, text = get_text(proxy.url, "/readyz?verbose", "admin-token")
                return text if status == 200 and "[+]cache-syncing:nodes (on demand" in text else ""

            wait_until(reported, timeout=10.0)
            text = reported()
            assert "403" in text or "forbidden" in text.lower(), text
            assert "readyz check passed" in text and "[+]cache-synced:configmaps ok (on demand)" in text, text
            _, view = call(proxy.url, "/debug/cache", "admin-token")
            nodes = view["caching"]["kinds"]["nodes"]
            assert nodes["state"] == "syncing" and nodes["last_upstream_error"] is not None
            metrics = get_text(proxy.url, "/metrics", "admin-token")[1]
            assert "watchcache_upstream_errors_total{" in metrics and 'resource="nodes"' in metrics
        finally:
            proxy.stop()
    finally:
        sim.stop()


def get_text(url: str, path: str, token: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*url.removeprefix("http://").rsplit(":", 1), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


GADGETS_CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def gadget_crd(*versions: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": v, "served": True, "storage": v == versions[0]} for v in versions],
        },
    }


def gadget(name: str, version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": f"example.com/{version}", "kind": "Gadget", "metadata": {"name": name}}


def test_custom_resources_follow_their_crds_created_changed_and_deleted_while_clients_watch() -> None:
    s = start_stack("--resources", "pods", "--workers", "2", sim_args=(*SIM, "--crds"))
    try:
        proxy, sim = s.proxy.url, s.sim.url
        gadgets = "/apis/example.com/v1/namespaces/ns-0/gadgets"
        write(sim, "POST", GADGETS_CRD, gadget_crd("v1"))  # after the proxy started
        write(sim, "POST", gadgets, gadget("g-1"))
        started = time.monotonic()

        def cached(path: str) -> bool:
            listed = get_ok(proxy, path)  # a read, on whichever worker: starts the kind there
            view = debug_cache(proxy)["resources"].get("example.com/v1/gadgets")
            replicas = view["replicas"].values() if view else ()
            return len(replicas) == 2 and all(r["ready"] for r in replicas) and listed == get_ok(sim, path)

        wait_until(lambda: cached(gadgets), timeout=5.0)
        took = time.monotonic() - started
        assert took < 5.0, took
        listed = get_ok(proxy, gadgets)
        assert [g["metadata"]["name"] for g in listed["items"]] == ["g-1"]
        passed = uncached(proxy)
        with WatchStream(
            proxy, path_with(gadgets, watch=1, resourceVersion=listed["metadata"]["resourceVersion"])
        ) as w:
            write(sim, "POST", gadgets, gadget("g-2"))
            event = w.next()
            assert event is not None and event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "g-2"
            assert uncached(proxy) == passed, "the watch is the cache's"
            # A new version: served, and cached from its first read, without a restart.
            write(sim, "PUT", f"{GADGETS_CRD}/gadgets.example.com", gadget_crd("v1", "v2"))
            v2 = gadgets.replace("/v1/", "/v2/")
            write(sim, "POST", v2, gadget("g-3", "v2"))
            wait_until(lambda: get(proxy, v2).status == 200 and get_ok(proxy, v2) == get_ok(sim, v2), timeout=5.0)
            # Deleted: its objects' DELETED events (the sim deletes them first, as kube's cleanup), then
            # the watch ends, as kube ends the watches of a kind whose CRD is gone.
            request(sim, "DELETE", f"{GADGETS_CRD}/gadgets.example.com")
            deleted = time.monotonic()
            seen = []
            while (event := w.next(timeout=10.0)) is not None:
                seen.append((event["type"], event["object"]["metadata"].get("name")))
            ended = time.monotonic() - deleted
        assert ("DELETED", "g-1") in seen and ("DELETED", "g-2") in seen, seen
        assert ended < 5.0, ended
        wait_until(lambda: get(proxy, gadgets).status == 404, timeout=5.0)
        wait_until(lambda: not any("gadgets" in name for name in debug_cache(proxy)["resources"]), timeout=5.0)
        assert debug_cache(proxy)["caching"]["stopped"].get("crd", 0) >= 1
        print(f"\nCRD created: served from the cache {took:.2f}s after; deleted: the watch ended {ended:.2f}s after")
    finally:
        s.proxy.stop()
        s.sim.stop()

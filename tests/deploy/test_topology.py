"""What deploy/README.md's scaling section relies on, with real processes: replicas sharing the
continue-token key serve each other's pages, and a watchcache can be another's upstream (two tiers)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.processes import Proc
from tests.deploy.support import DEPLOY, http_get, start, wait_ready

KEY = DEPLOY / "kubernetes" / "base" / "continue-token.key"


@dataclass
class Topology:
    sim: Proc
    replica_a: Proc  # two replicas of one tier, same key file (the base's Secret)
    replica_b: Proc
    other_key: Proc  # a replica with a different key
    edge: Proc  # a second tier, upstream = replica_a


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    other_key = tmp_path_factory.mktemp("key") / "key"
    other_key.write_text("another-key-of-at-least-16-bytes\n")
    started: list[Proc] = []

    def serve(upstream: str, key: Path) -> Proc:
        args = ["serve", "--listen", "127.0.0.1:0", "--upstream", upstream, "--workers", "1"]
        proc = start([*args, "--continue-token-key-file", str(key), "--resources", "pods,namespaces"])
        started.append(proc)
        return proc

    try:
        sim = start(["sim", "--listen", "127.0.0.1:0", "--objects", "60", "--namespaces", "3"])
        started.append(sim)
        with ThreadPoolExecutor(3) as pool:  # start the three replicas side by side
            a, b, c = pool.map(lambda key: serve(sim.url, key), [KEY, KEY, other_key])
        edge = serve(a.url, KEY)
        for proc in (a, b, c, edge):
            wait_ready(proc.url)
        yield Topology(sim, a, b, c, edge)
    finally:
        for proc in reversed(started):
            proc.stop()


def _list(url: str, **params: str) -> tuple[int, dict]:
    status, body = http_get(f"{url}/api/v1/pods?{urllib.parse.urlencode(params)}")
    return status, json.loads(body)


def test_replicas_with_the_shared_key_continue_each_others_pages(topology: Topology) -> None:
    status, first = _list(topology.replica_a.url, limit="25")
    assert status == 200 and len(first["items"]) == 25
    token = first["metadata"]["continue"]
    status, second = _list(topology.replica_b.url, limit="25", **{"continue": token})
    assert status == 200, second
    names = [p["metadata"]["name"] for p in first["items"] + second["items"]]
    assert len(set(names)) == 50
    status, refused = _list(topology.other_key.url, limit="25", **{"continue": token})
    assert status == 400 and "continue" in refused["message"], refused


def test_a_watchcache_is_the_upstream_of_another(topology: Topology) -> None:
    status, direct = _list(topology.sim.url)
    assert status == 200
    status, through_two_tiers = _list(topology.edge.url)
    assert status == 200
    assert {p["metadata"]["name"] for p in through_two_tiers["items"]} == {
        p["metadata"]["name"] for p in direct["items"]
    }
    # Same resourceVersion space: the edge is exactly as new as the sim (no churn here).
    assert through_two_tiers["metadata"]["resourceVersion"] == direct["metadata"]["resourceVersion"]

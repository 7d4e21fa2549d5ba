"""Full objects in protobuf from a worker group: the owner's protobuf cache, followed by the other workers
(one protobuf upstream watch per resource), every worker answering with kube-apiserver's bytes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest

from harness.processes import Proc, start, wait_ready
from tests.protobuf.recorded import PB, RecordedUpstream, b, from_cache
from tests.protobuf.test_recorded import TYPED, normalized_bookmark, request, watch
from tests.support.metrics import scrape, total
from watchcache.kubeproto import objects

RESOURCES = "pods,configmaps,secrets,nodes,namespaces"


@pytest.fixture(scope="module")
def group(upstream: RecordedUpstream) -> Iterator[Proc]:
    proc = start(
        "serve", "--upstream", upstream.url, "--authentication", "none", "--workers", "2", "--resources", RESOURCES
    )
    wait_ready(proc)
    yield proc
    proc.stop()


def test_every_worker_answers_kubes_protobuf_with_one_upstream_watch(
    group: Proc, upstream: RecordedUpstream, record: dict[str, Any]
) -> None:
    reads = [r for r in record["reads"] if r["kind"] in RESOURCES.split(",") and "limit=" not in r["path"]]
    assert len(reads) > 10
    # Each request on a new connection: the kernel spreads them over both workers (SO_REUSEPORT).
    deadline = time.monotonic() + 30
    while True:
        answers = [request(group, from_cache(r["path"]), TYPED) for r in reads for _ in range(3)]
        if all(content_type == PB for _, content_type, _ in answers) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for i, (status, content_type, body) in enumerate(answers):
        read = reads[i // 3]
        assert (status, content_type) == (200, PB), read["path"]
        assert body == b(read["body"]), read["path"]
    assert any("follows the protobuf cache of" in line for line in group.log), group.log[-20:]

    def long_watches(kind: str) -> list[str]:
        path = record["kinds"][kind]["path"]
        return [
            q
            for p, q, accept in list(upstream.requests)
            if p == path and accept.startswith(PB) and "watch=1" in q and int(parse_qs(q)["timeoutSeconds"][0]) > 10
        ]  # (the reflector's, 300-600 s; not the 4 s watches that learn a kind's empty object)

    deadline = time.monotonic() + 10  # a cache's watch starts right after its list
    while any(not long_watches(kind) for kind in RESOURCES.split(",")) and time.monotonic() < deadline:
        time.sleep(0.1)
    for kind in RESOURCES.split(","):
        assert len(long_watches(kind)) == 1, (kind, long_watches(kind))


def test_the_protobuf_caches_are_in_the_metrics(group: Proc, record: dict[str, Any]) -> None:
    """Any worker's /metrics has every worker's protobuf caches: the owner's, and followers of it."""
    # At resourceVersion=0, so the cache answers (and makes its protobuf cache): a GET without one goes
    # to the upstream before any cache is asked (server/decision.py).
    pods = (
        next(r["path"] for r in record["reads"] if r["kind"] == "pods" and "?" not in r["path"]) + "?resourceVersion=0"
    )
    deadline = time.monotonic() + 30
    while True:  # a few requests, so that both workers have a cache of pods (owner, follower)
        in_pb = [request(group, pods, TYPED)[1] == PB for _ in range(6)]
        _, samples = scrape(group.url)
        replicas = {s.labels["replica"] for s in samples.get("watchcache_protobuf_cache_ready", [])
                    if s.labels["resource"] == "pods" and s.value == 1}  # fmt: skip
        if (all(in_pb) and replicas == {"owner", "follower"}) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert replicas == {"owner", "follower"}
    assert total(samples, "watchcache_protobuf_cache_objects", resource="pods", replica="owner") == 3
    assert total(samples, "watchcache_protobuf_cache_objects", resource="pods", replica="follower") == 3
    # Each resource's protobuf cache started once in the group, whichever resources the module's tests read.
    owned = {
        s.labels["resource"]
        for s in samples.get("watchcache_protobuf_cache_ready", [])
        if s.labels["replica"] == "owner"
    }
    assert "pods" in owned and total(samples, "watchcache_protobuf_caches_started_total") == len(owned)
    assert total(samples, "watchcache_protobuf_caches_refused") == 0


def test_debug_cache_shows_each_resources_protobuf_cache_across_the_group(group: Proc, record: dict[str, Any]) -> None:
    """/debug/cache, whichever worker answers: the owner's protobuf cache of pods, and its follower."""
    # At resourceVersion=0, so the cache answers (and makes its protobuf cache): a GET without one goes
    # to the upstream before any cache is asked (server/decision.py).
    pods = (
        next(r["path"] for r in record["reads"] if r["kind"] == "pods" and "?" not in r["path"]) + "?resourceVersion=0"
    )
    deadline = time.monotonic() + 30
    while True:
        request(group, pods, TYPED)
        status, _, body = request(group, "/debug/cache", "application/json")
        assert status == 200
        protobuf = json.loads(body)["resources"]["pods"].get("protobuf", {})
        roles = sorted(r["role"] for r in protobuf.get("replicas", {}).values() if r["ready"])
        if roles == ["follower", "owner"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert roles == ["follower", "owner"], protobuf
    assert protobuf["objects"] == 3 and protobuf["object_bytes"] > 0 and protobuf["ready"] is True
    assert all(r["objects"] == 3 for r in protobuf["replicas"].values())


def test_every_workers_bookmark_is_kubes_empty_object(group: Proc, record: dict[str, Any]) -> None:
    """A follower learns its kinds' empty objects by a watch-list of its own (the follow stream carries no
    bookmark): before, a protobuf watch on a follower ended its initial events with a bare bookmark."""
    for kind in ("nodes", "secrets"):
        entry = record["kinds"][kind]
        items = objects.list_page(objects.unknown(b(entry["protobuf"])).raw).items
        deadline = time.monotonic() + 30  # both workers' protobuf caches ready: 6 answers in protobuf in a row
        in_a_row = 0
        while in_a_row < 6:
            assert time.monotonic() < deadline, f"{kind}: no protobuf cache on every worker"
            ok = request(group, entry["path"] + "?resourceVersion=0", TYPED)[1] == PB
            in_a_row = in_a_row + 1 if ok else 0
        path = entry["path"] + "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        path += f"&allowWatchBookmarks=true&resourceVersion={record['R']}&timeoutSeconds=5"
        for _ in range(8):  # new connections: the kernel spreads them over both workers
            _, frames = watch(group, path, len(items) + 1)
            assert normalized_bookmark(frames[-1]) == normalized_bookmark(b(entry["bookmark"])), kind

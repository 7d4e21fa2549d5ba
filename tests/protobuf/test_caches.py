"""The protobuf caches' life (upstream/protobuf.py): made on first use, dropped when idle, not retried
after the upstream refused protobuf; in front of the simulated cluster, typed clients get JSON and a
protobuf-only client gets kube's 406 for a kind without protobuf."""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Stack, logged, start, start_stack, wait_ready
from harness.waiting import until
from tests.protobuf.recorded import PB, RecordedUpstream, b
from watchcache.cache.store import CacheConfig
from watchcache.kubeproto import objects
from watchcache.resources import CONFIGMAPS, PODS, ResourceType
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.protobuf import ProtobufCaches
from watchcache.upstream.reflector import ReflectorConfig


def test_a_protobuf_cache_is_made_on_first_use_and_dropped_when_idle(record: dict[str, Any]) -> None:
    fake = RecordedUpstream(record)
    try:
        asyncio.run(_made_and_dropped(fake.url))
    finally:
        fake.stop()


async def _made_and_dropped(url: str) -> None:
    client = UpstreamClient(UpstreamConfig(server=url))
    await client.start()
    caches = ProtobufCaches(client, CacheConfig(), ReflectorConfig(), owns=lambda r: r is not CONFIGMAPS)
    try:
        assert caches.cacher(PODS) is None  # started, not synced yet
        assert caches.started == 1
        await until(lambda: caches.cacher(PODS) is not None)
        assert caches.started == 1  # one cache per resource
        cacher = caches.cacher(PODS)
        assert cacher is not None and len(cacher.cache) == 3
        assert caches.cacher(CONFIGMAPS) is None and caches.started == 1  # another worker's
        widgets = ResourceType("example.com", "v1", "widgets", "Widget", True)
        assert caches.cacher(widgets) is None and caches.started == 1  # kube has no protobuf for it
        caches.idle_timeout = 0.0
        cacher.last_used -= 1.0
        caches.drop_idle()
        assert caches.cachers() == [] and caches.dropped == 1
        assert cacher.state.value == "stopped"
    finally:
        caches.stop()
        await client.close()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = start_stack("--workers", "1", sim_args=("--objects", "20", "--namespaces", "2"))
    yield s
    s.sim.stop()
    s.proxy.stop()


def get(url: str, path: str, accept: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def test_in_front_of_the_simulated_cluster_protobuf_is_refused_as_kube_refuses_it(
    stack: Stack, record: dict[str, Any]
) -> None:
    proxy = stack.proxy
    assert get(proxy.url, "/api/v1/pods", PB + ", */*")[:2] == (200, "application/json")
    deadline = time.monotonic() + 10
    while not logged(proxy, "protobuf cache of pods: the upstream does not serve it in protobuf"):
        assert time.monotonic() < deadline, "".join(proxy.log[-20:])
        time.sleep(0.1)
    for _ in range(3):
        assert get(proxy.url, "/api/v1/pods", PB + ", */*")[:2] == (200, "application/json")
        status, content_type, body = get(proxy.url, "/api/v1/pods", PB)
        assert (status, content_type, body) == (406, PB, b(record["refused"]))  # the sim's, passed through
    assert sum("protobuf cache of pods: started" in line for line in proxy.log) == 1  # not asked again
    _, _, metrics = get(proxy.url, "/metrics", "text/plain")
    line = next(x for x in metrics.decode().splitlines() if 'passthrough_requests_total{reason="protobuf"}' in x)
    assert float(line.rsplit(" ", 1)[1]) == 3


def test_protobuf_watches_count_toward_max_watchers(record: dict[str, Any]) -> None:
    fake = RecordedUpstream(record)
    proxy = start(
        "serve", "--upstream", fake.url, "--authentication", "none", "--workers", "1",
        "--resources", "configmaps", "--max-watchers", "1",
    )  # fmt: skip
    try:
        wait_ready(proxy)
        deadline = time.monotonic() + 20
        while get(proxy.url, "/api/v1/configmaps", PB + ", */*")[1] != PB:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=10)
        conn.request("GET", "/api/v1/configmaps?watch=1&resourceVersion=0", headers={"Accept": PB})
        first = conn.getresponse()
        assert (first.status, first.getheader("Content-Type")) == (200, PB + ";stream=watch")
        status, _, _ = get(proxy.url, "/api/v1/configmaps?watch=1&resourceVersion=0", "application/json")
        assert status == 429  # the protobuf watch holds the one slot
        conn.close()
    finally:
        proxy.stop()
        fake.stop()


def test_at_shutdown_a_protobuf_watch_gets_its_final_bookmark(record: dict[str, Any]) -> None:
    fake = RecordedUpstream(record)
    proxy = start(
        "serve", "--upstream", fake.url, "--authentication", "none", "--workers", "1", "--resources", "configmaps"
    )  # fmt: skip
    try:
        wait_ready(proxy)
        deadline = time.monotonic() + 20
        while get(proxy.url, "/api/v1/configmaps?resourceVersion=0", PB + ", */*")[1] != PB:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=10)
        path = f"/api/v1/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={record['R']}"
        conn.request("GET", path, headers={"Accept": PB})
        resp = conn.getresponse()
        assert resp.status == 200
        proxy.stop()  # SIGTERM
        frames, rest = objects.split_frames(resp.read())  # to the end of the stream
        assert rest == b"" and [objects.watch_event(f)[0] for f in frames] == ["BOOKMARK"]
        rv, _ = objects.bookmark_meta(objects.unknown(objects.watch_event(frames[0])[1]).raw)
        assert int(rv) >= int(record["R"])
        conn.close()
    finally:
        proxy.stop()
        fake.stop()

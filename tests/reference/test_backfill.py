"""Backfill against the real kube-apiserver: what the proxy assumes of its upstream, checked.

A "restarted proxy" (a Cacher whose reflector lists the kit's configmaps, cluster-wide) is asked
for rvs older than its window, which the test wrote in a namespace of its own
(``i20-backfill-*``): the Exact LIST at the old rv and the watch from it must give exactly the
upstream's history, with the proof of completeness (an event at or past the window's start, or a
bookmark) coming within the fetch's bounds. The slow test shows where kube's own limit is: an rv
its watch cache has dropped gets 410 on the watch while etcd still answers the Exact LIST (set
WATCHCACHE_REFERENCE_SLOW=1: ~2 min, 600 writes).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from harness.kube.kit import Api, ApiError, KubeEnv, drop_namespace, needs_kube
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.backfill import BackfillFailed, BackfillLimits, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import CONFIGMAPS
from watchcache.upstream.backfill import UpstreamBackfill
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.reflector import Reflector

pytestmark = needs_kube


@pytest.fixture
def kube() -> KubeEnv:
    return KubeEnv.from_environ()


@pytest.fixture
def namespace(kube: KubeEnv) -> Iterator[tuple[Api, str]]:
    api = Api(kube.url, kube.token, kube.ca)
    name = f"i20-backfill-{uuid.uuid4().hex[:6]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield api, name
    finally:
        drop_namespace(api, name, ("configmaps",))
        api.close()


def write(api: Api, ns: str, name: str, value: str) -> int:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    try:
        obj = api.merge_patch(f"{path}/{name}", {"data": {"v": value}})
    except ApiError as e:
        if e.status != 404:
            raise
        obj = api.create(path, {"metadata": {"name": name}, "data": {"v": value}})
    return int(obj["metadata"]["resourceVersion"])


async def restarted_proxy(kube: KubeEnv) -> tuple[Cacher, UpstreamClient, asyncio.Task[None]]:
    client = UpstreamClient(UpstreamConfig(server=kube.url, token=kube.token, ca_file=kube.ca))
    await client.start()
    cacher = Cacher(CONFIGMAPS, CacheConfig())
    cacher.backfills = UpstreamBackfill(client, BackfillLimits(coalesce=0.05)).backfills(cacher)
    task = asyncio.ensure_future(Reflector(client, cacher).run())
    assert await cacher.wait_ready(30)
    return cacher, client, task


def mine(events: list, ns: str, names: set[str]) -> list[tuple[str, str, int, int | None]]:
    """The test's own events: the kit's controllers add ConfigMaps of their own to a new namespace
    (kube-root-ca.crt, openshift-service-ca.crt) whenever they get to it."""
    return [
        (e.type, e.object.name, e.rv, None if e.prev is None else e.prev.rv)
        for e in events
        if e.object.namespace == ns and e.object.name in names
    ]


def test_the_history_before_a_restarted_proxys_window_is_the_apiservers(
    kube: KubeEnv, namespace: tuple[Api, str]
) -> None:
    api, ns = namespace
    writes = [(f"c{i % 3}", write(api, ns, f"c{i % 3}", str(i))) for i in range(12)]
    held = writes[2][1]  # a client saw up to here before the proxy restarted

    async def go() -> tuple[list, float, dict[str, int]]:
        cacher, client, task = await restarted_proxy(kube)
        try:
            assert cacher.cache.oldest_rv >= writes[-1][1]
            started = time.monotonic()
            results = await asyncio.gather(*(reach_back(cacher, rv, 15.0) for _, rv in writes[2:]))
            took = time.monotonic() - started
            assert results == [None] * len(results), results
            assert cacher.backfills is not None
            own = {name for name, _ in writes}
            return mine(cacher.cache.events_since(held), ns, own), took, dict(cacher.backfills.fetches)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    events, took, fetches = asyncio.run(go())
    previous: dict[str, int] = dict((name, rv) for name, rv in writes[:3])
    expected = []
    for name, rv in writes[3:]:
        expected.append(("MODIFIED", name, rv, previous[name]))
        previous[name] = rv
    assert events == expected
    assert fetches == {"ok": 1}  # one Exact LIST + watch for every request
    assert took < 10.0, f"the fetch took {took:.2f}s"
    print(f"backfill from rv {held} against kube-apiserver: {took:.2f}s")


@pytest.mark.skipif(not os.environ.get("WATCHCACHE_REFERENCE_SLOW"), reason="set WATCHCACHE_REFERENCE_SLOW=1: ~2 min")
@pytest.mark.timeout(400)
def test_an_rv_kubes_watch_cache_dropped_is_410_though_etcd_still_lists_it(
    kube: KubeEnv, namespace: tuple[Api, str]
) -> None:
    api, ns = namespace
    old = write(api, ns, "old", "0")
    time.sleep(80)  # past kube's eventFreshDuration (75 s): its watch cache may now drop the event...
    for i in range(600):  # ...once more events than its capacity come
        write(api, ns, f"b{i % 20}", str(i))
    listed = api.get(f"/api/v1/namespaces/{ns}/configmaps", resourceVersion=old, resourceVersionMatch="Exact")
    assert int(listed["metadata"]["resourceVersion"]) == old  # etcd still has the revision

    async def go() -> BackfillFailed | None:
        cacher, client, task = await restarted_proxy(kube)
        try:
            return await reach_back(cacher, old, 15.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    failed = asyncio.run(go())
    assert failed is not None and failed.outcome == BackfillFailed.GONE
    assert "too old resource version" in str(failed)

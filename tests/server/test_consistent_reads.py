"""Consistent reads in the handler: the one wait (``freshness.reach``), proofs asked for only when the
cache is behind, and small reads passed through rather than waiting for a proof."""

from __future__ import annotations

import time

from tests.support.factories import pod
from tests.support.harness import DELETED, Harness, arun, background
from tests.support.waiting import until


def feed_later(h: Harness, *, proving: bool) -> None:
    """The upstream committed rv 11 (p0 deleted); the cache sees it once the read waits for it:
    with a proof under way (``proving``) or, for a read that waits briefly without one, once it
    has asked the upstream for its rv. A condition, not a delay: the order holds on a busy machine."""
    h.upstream.rv = 11
    up = h.upstream

    async def feed() -> None:
        await until(lambda: up.proving_now > 0 if proving else up.consistent_calls > 0)
        h.cacher.apply([(DELETED, pod("p0", rv=11))])

    background(feed())


@arun
async def test_a_cache_at_the_target_needs_no_proof() -> None:
    h = Harness()
    h.upstream.rv = 10
    resp = await h.list()
    assert resp.status == 200
    assert h.upstream.consistent_calls == 1 and h.upstream.proving_seen == 0


@arun
async def test_a_large_consistent_list_waits_for_proof_and_is_served_from_cache() -> None:
    h = Harness(fresh_wait=2.0, consistent_passthrough_objects=2)  # 5 pods in scope: more than 2
    feed_later(h, proving=True)
    resp = await h.list()
    assert resp.status == 200 and "p0" not in [i["metadata"]["name"] for i in resp.json()["items"]]
    assert h.upstream.proving_seen == 1 and h.upstream.forwarded == []


@arun
async def test_a_small_consistent_read_passes_through_rather_than_wait_for_a_proof() -> None:
    h = Harness(fresh_wait=2.0, consistent_passthrough_objects=500)
    h.upstream.rv = 20  # the cache will not get there by itself
    for read in (h.get("p1"), h.list(), h.list(labelSelector="i=1")):
        started = time.monotonic()
        resp = await read
        assert time.monotonic() - started < 0.5
        assert resp.status == 404  # FakeUpstream.forward: the request went to the upstream
    assert len(h.upstream.forwarded) == 3 and h.upstream.proving_seen == 0


@arun
async def test_a_small_consistent_read_still_waits_briefly_for_events_on_their_way() -> None:
    h = Harness(fresh_wait=2.0, consistent_passthrough_objects=500)
    feed_later(h, proving=False)
    resp = await h.get("p0")
    assert resp.status == 404 and resp.json()["message"] == 'pods "p0" not found'  # from the cache, at rv 11
    assert h.upstream.forwarded == []


@arun
async def test_a_paged_consistent_list_is_never_passed_through_for_its_size() -> None:
    h = Harness(fresh_wait=2.0, consistent_passthrough_objects=500)
    feed_later(h, proving=True)
    resp = await h.list(limit="2")
    assert resp.status == 200 and h.upstream.forwarded == [] and h.upstream.proving_seen == 1

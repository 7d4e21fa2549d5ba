"""Consistent-read proofs against a counting upstream on a real socket: what the proxy asks of the
upstream stays bounded whatever the clients do."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from harness.waiting import until
from tests.support.factories import pod
from tests.upstream.fakeapi import fake_api
from watchcache.cache.events import ADDED
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached, reach
from watchcache.resources import PODS
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.probes import ProbeLimits, Prober

FAR = 1_000_000_000_000_000


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_probe_that_fails_fast_is_not_retried_in_a_loop() -> None:
    async def go() -> int:
        async with fake_api() as (api, client):
            api.watch_error = 410
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=0.5)
            assert not (await reach(cacher, FAR, reads, 0.5)).reached
            return api.requests["watch"]

    watches = run(go())
    assert watches <= 3, f"one read waiting 0.5 s opened {watches} upstream watches"


def test_a_thousand_far_future_reads_open_a_bounded_number_of_probes() -> None:
    async def go() -> tuple[int, int]:
        async with fake_api() as (api, client):
            api.watch_error = 403
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=1.0)
            results = await asyncio.gather(*(reach(cacher, FAR + i, reads, 1.0) for i in range(1000)))
            assert not any(r.reached for r in results)
            return api.requests["watch"], cacher.waiting

    watches, waiting = run(go())
    assert watches <= 4, f"1,000 reads waiting 1 s opened {watches} upstream watches"
    assert waiting == 0


def test_consistent_reads_with_a_failing_target_fetch_ask_the_upstream_a_bounded_number_of_times() -> None:
    async def go() -> int:
        async with fake_api() as (api, client):
            api.list_error = 500
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=0.5)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 1.0

            async def client_loop() -> None:
                while loop.time() < deadline:  # a client that retries at once after each pass-through
                    assert not (await reach(cacher, None, reads, 0.5)).reached

            await asyncio.gather(*(client_loop() for _ in range(100)))
            return api.requests["list"]

    lists = run(go())
    assert lists <= 10, f"100 clients retrying for 1 s made {lists} target fetches"


def pod_json(name: str, rv: int) -> dict[str, object]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "d", "resourceVersion": str(rv)}}


def test_a_probe_bookmark_proves_the_cache_current_and_serves_every_waiting_read() -> None:
    async def go() -> tuple[list[Reached], int, int]:
        async with fake_api() as (api, client):
            api.rv = 150  # the upstream moved (other resources' writes); no pod changed
            cacher = Cacher(PODS)
            cacher.replace([], 100)
            reads = ConsistentReads(client, fresh_wait=3.0)
            first = asyncio.ensure_future(reach(cacher, None, reads, 3.0))
            await until(lambda: api.requests["watch"] == 1)  # the first read's probe is under way
            second = asyncio.ensure_future(reach(cacher, None, reads, 3.0))  # joins it
            waits = await asyncio.gather(first, second)
            return [w.how for w in waits], cacher.rv, api.requests["watch"]

    hows, rv, watches = run(go())
    assert hows == [Reached.PROGRESS, Reached.PROGRESS]
    assert rv == 150
    assert watches == 1


def test_a_probe_proves_nothing_until_the_cache_has_applied_what_the_probe_saw() -> None:
    async def go() -> tuple[bool, int, bool]:
        async with fake_api() as (api, client):
            api.rv = 150
            api.events = [pod_json("a", 120)]  # a change the reflector has not delivered yet
            api.bookmark_after = 0.05
            cacher = Cacher(PODS)
            cacher.replace([], 100)
            reads = ConsistentReads(client, fresh_wait=3.0)
            waiting = asyncio.ensure_future(reach(cacher, 150, reads, 3.0))
            # The probe's bookmark came: it waits for the cache to apply the event it saw (120).
            await until(lambda: any(rv == 120 for rv, _, _ in cacher._waiters))
            before = cacher.rv
            cacher.apply([(ADDED, pod("a", "d", 120))])  # the reflector delivers it
            wait = await waiting
            return wait.reached, before, cacher.rv == 150

    reached, before, at_bookmark = run(go())
    assert before == 100, "progress was claimed before the cache held the probe's events"
    assert reached and at_bookmark


def test_probes_of_one_resource_are_few_and_staggered_while_reads_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stagger is between the prober's starts. (Measured where the fake API received them, two starts
    # 0.8 s apart could arrive closer on a loaded machine, the first one's connection being slower.)
    starts: list[float] = []
    start = Prober._start

    def recorded(self: Prober, now: float) -> None:
        starts.append(now)
        start(self, now)

    monkeypatch.setattr(Prober, "_start", recorded)

    async def go() -> int:
        async with fake_api() as (api, client):
            api.bookmark_after = 10.0  # never before the probe's own end: no proof ever comes
            cacher = Cacher(PODS)
            cacher.replace([], 100)
            reads = ConsistentReads(client, fresh_wait=2.5)
            await asyncio.gather(*(reach(cacher, FAR, reads, 2.5) for _ in range(200)))
            return api.max_open_watches

    most = run(go())
    assert len(starts) >= 2
    limits = ProbeLimits()
    assert most <= limits.max_concurrent
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(g >= limits.stagger * 0.9 for g in gaps), gaps


# ---------------------------------------------------------------- scope proofs (consistent LISTs and watches)


def cached_pods(rvs: dict[str, int], head: int) -> Cacher:
    cacher = Cacher(PODS)
    cacher.replace([pod(name, ns="d", rv=rv) for name, rv in rvs.items()], head)
    return cacher


def test_a_scope_the_cache_holds_as_the_upstream_lists_it_is_proven_in_one_round_trip() -> None:
    async def go() -> None:
        async with fake_api() as (api, client):
            api.rv = 900  # the cluster moved on (Leases, Events), the pods did not
            api.objects = {("d", "a"): 10, ("d", "b"): 20, ("e", "c"): 30}
            cacher = cached_pods({"a": 10, "b": 20}, 50)
            other = Cacher(PODS)
            other.replace([pod("c", ns="e", rv=30), *cacher.cache.snapshot().iter_range("", None)], 50)
            reads = ConsistentReads(client, fresh_wait=2.0)
            assert await reads.prove_scope(cacher, "d", 2.0) is Reached.PROGRESS
            assert cacher.rv == 50  # one namespace proven: the resource's rv is not
            assert await reads.prove_scope(other, None, 2.0) is Reached.PROGRESS
            assert other.rv == 900  # every namespace: the cache is the state at 900
            assert api.requests["metadata"] == 2 and api.requests["watch"] == 0

    run(go())


def test_a_change_the_cache_has_not_seen_fails_the_proof_quickly() -> None:
    async def go() -> None:
        async with fake_api() as (api, client):
            api.rv = 900
            cacher = cached_pods({"a": 10, "b": 20}, 50)
            reads = ConsistentReads(client, fresh_wait=2.0)
            loop = asyncio.get_running_loop()
            changes = (
                {("d", "a"): 10, ("d", "b"): 60},
                {("d", "a"): 10},
                {("d", "a"): 10, ("d", "b"): 20, ("d", "x"): 70},
            )
            for objects in changes:
                api.objects = objects  # modified, deleted, created upstream: not in the cache
                started = loop.time()
                assert await reads.prove_scope(cacher, "d", 2.0) is Reached.IMPATIENT
                assert loop.time() - started < 0.5

    run(go())


def test_a_change_on_its_way_is_waited_for_then_proven() -> None:
    async def go() -> None:
        async with fake_api() as (api, client):
            api.rv = 900
            api.objects = {("d", "a"): 10, ("d", "b"): 60}
            cacher = cached_pods({"a": 10, "b": 20}, 50)
            reads = ConsistentReads(client, fresh_wait=2.0)

            async def deliver() -> None:
                await until(lambda: api.requests["metadata"] == 1)
                await asyncio.sleep(0.005)
                cacher.apply([(ADDED, pod("b", ns="d", rv=60))])

            feeder = asyncio.ensure_future(deliver())
            assert await reads.prove_scope(cacher, "d", 2.0) is Reached.EVENTS
            await feeder

    run(go())


def test_a_hundred_concurrent_consistent_reads_share_a_few_proofs() -> None:
    async def go() -> int:
        async with fake_api() as (api, client):
            api.rv = 900
            api.metadata_delay = 0.02
            api.objects = {("d", "a"): 10}
            cacher = cached_pods({"a": 10}, 50)
            reads = ConsistentReads(client, fresh_wait=2.0)
            results = await asyncio.gather(*(reads.prove_scope(cacher, "d", 2.0) for _ in range(100)))
            assert set(results) == {Reached.PROGRESS}
            return api.requests["metadata"]

    lists = run(go())
    assert lists <= 2, f"100 concurrent reads made {lists} metadata LISTs"


def test_a_read_joins_only_a_proof_that_started_after_it_arrived() -> None:
    """A LIST under way may have read the state before a write the read must see."""

    async def go() -> None:
        async with fake_api() as (api, client):
            api.rv = 900
            api.metadata_delay = 0.1
            api.objects = {("d", "a"): 10}
            cacher = cached_pods({"a": 10}, 50)
            reads = ConsistentReads(client, fresh_wait=2.0)
            first = asyncio.ensure_future(reads.prove_scope(cacher, "d", 2.0))
            await until(lambda: api.requests["metadata"] == 1)
            api.objects = {("d", "a"): 95}  # written after the first LIST read its state
            api.rv = 950
            second = asyncio.ensure_future(reads.prove_scope(cacher, "d", 2.0))  # arrives during the first LIST
            assert await first is Reached.PROGRESS
            assert await second is Reached.IMPATIENT  # its own LIST saw the write: not the first one's answer
            assert api.requests["metadata"] == 2

    run(go())


def test_scope_proofs_are_bounded_per_namespace_and_their_counts_never_go_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from watchcache.upstream import consistency

    monkeypatch.setattr(consistency, "_MAX_SCOPES", 4)

    async def go() -> None:
        async with fake_api() as (api, client):
            api.rv = 900
            cacher = cached_pods({}, 50)
            reads = ConsistentReads(client, fresh_wait=2.0)
            for i in range(10):  # ten namespaces named by clients: at most four flights kept
                assert await reads.prove_scope(cacher, f"ns-{i}", 2.0) is Reached.PROGRESS
                assert len(reads._scopes) <= 4
                assert dict(((r.resource, o), n) for r, o, n in reads.scope_fetches()) == {(PODS.resource, "ok"): i + 1}

    run(go())


_NO_BOOKMARK_LIMITS = ProbeLimits(
    timeout_seconds=1, unprovable_after=2, unprovable_for=0.5, linger=0.0, backoff_initial=0.01, backoff_max=0.01
)


def _behind_an_upstream_without_bookmarks(api: Any) -> Cacher:
    """A pods cache at rv 100; the upstream at 150, whose probe watches send no bookmark."""
    api.rv = 150
    api.bookmark_after = 99.0  # never
    cacher = Cacher(PODS)
    cacher.replace([], 100)
    return cacher


def test_a_resource_whose_probes_get_no_bookmark_is_unprovable_and_looked_at_again_in_the_background() -> None:
    # kube-apiserver serves events from etcd (no watch cache by default): their watches send no
    # bookmark, so no probe proves a cache's progress; reads ahead of the cache stop waiting for one.
    # Every unprovable_for a probe looks again, with no read waiting for it: its lack renews the mark,
    # a proof clears it.
    async def go() -> tuple[list[bool], int]:
        async with fake_api() as (api, client):
            cacher = _behind_an_upstream_without_bookmarks(api)
            reads = ConsistentReads(client, fresh_wait=1.5, probes=_NO_BOOKMARK_LIMITS)
            seen = [reads.unprovable(cacher)]
            assert not (await reach(cacher, 150, reads, 1.5)).reached
            await until(lambda: reads.unprovable(cacher))  # two probes' watches ended without a bookmark
            prober = reads.prober(cacher)
            await until(lambda: prober.running == 0)
            watches = api.requests["watch"]
            await asyncio.sleep(0.6)  # past unprovable_for: still unprovable, and a probe looks again
            seen.append(reads.unprovable(cacher))
            assert prober.running == 1
            await until(lambda: api.requests["watch"] == watches + 1)
            await until(lambda: prober.running == 0)  # it ended without a bookmark: the mark is renewed
            seen.append(reads.unprovable(cacher))
            api.bookmark_after = 0.05  # the upstream proves it now
            await asyncio.sleep(0.6)
            seen.append(reads.unprovable(cacher))  # the next look is under way...
            await until(lambda: not reads.unprovable(cacher))  # ...and its proof clears the mark
            seen.append(reads.unprovable(cacher))
            return seen, cacher.rv

    seen, rv = run(go())
    assert seen == [False, True, True, True, False]
    assert rv == 150  # the background probe's proof moved the cache


def test_events_start_out_unprovable_as_kube_does_not_cache_them_by_default() -> None:
    # kube-apiserver's DefaultWatchCacheSizes: events (both groups) 0. Without this prior, the first
    # read ahead of the proxy's events cache waited for probes that could not prove it: a 504 after
    # --fresh-wait where kube answers at once (seen against the kit, session 46).
    import dataclasses

    events_type = dataclasses.replace(PODS, resource="events", kind="Event")

    async def go() -> tuple[bool, bool, int, bool]:
        async with fake_api() as (api, client):
            api.bookmark_after = 0.05  # this apiserver caches them after all
            pods, events = Cacher(PODS), Cacher(events_type)
            pods.replace([], 100)
            events.replace([], 100)
            reads = ConsistentReads(client, fresh_wait=1.5, probes=_NO_BOOKMARK_LIMITS)
            first = reads.unprovable(events)
            pods_first = reads.unprovable(pods)
            await until(lambda: api.requests["watch"] == 1)  # the background look of events' prober
            watches = api.requests["watch"]
            await until(lambda: not reads.unprovable(events))  # its proof clears the prior
            return first, pods_first, watches, reads.unprovable(events)

    first, pods_first, watches, after = run(go())
    assert (first, pods_first, watches, after) == (True, False, 1, False)


def test_a_read_ahead_gives_up_when_a_probe_of_a_never_proven_resource_ends_without_a_bookmark() -> None:
    # A GET or LIST at an rv ahead (give_up_unproven) stops waiting as soon as no proof is coming, and
    # goes to the upstream, instead of a 504 at its timeout. A resource proven once keeps waiting.
    async def go() -> tuple[Reached, float, Reached]:
        async with fake_api() as (api, client):
            cacher = _behind_an_upstream_without_bookmarks(api)
            reads = ConsistentReads(client, fresh_wait=5.0, probes=_NO_BOOKMARK_LIMITS)
            started = asyncio.get_running_loop().time()
            gave_up = await reach(cacher, 150, reads, 5.0, give_up_unproven=True)
            took = asyncio.get_running_loop().time() - started
            api.bookmark_after = 0.05
            assert (await reach(cacher, 150, reads, 5.0)).reached  # proven once
            api.rv, api.bookmark_after = 200, 99.0
            kept = await reach(cacher, 200, reads, 1.5, give_up_unproven=True)
            return gave_up.how, took, kept.how

    gave_up, took, kept = run(go())
    assert gave_up is Reached.UNPROVEN and took < 2.0  # the probe's 1 s watch, not the 5 s wait
    assert kept is Reached.TIMEOUT


def test_a_resource_the_upstream_caches_is_not_unprovable_for_one_missed_bookmark() -> None:
    # kube's cacher now and then sends a watcher no bookmark (its timer against the deadline): only
    # unprovable_after probes in a row without one, no proof between, mark the resource.
    from collections import Counter

    from watchcache.ratelimit import TokenBucket
    from watchcache.upstream.probes import Outcome

    async def go() -> list[bool]:
        limits = ProbeLimits(unprovable_after=3)
        prober = Prober(None, Cacher(PODS), limits, TokenBucket(10, 10, 0.0), Counter())  # type: ignore[arg-type]
        seen = []
        for outcome in (Outcome.NO_BOOKMARK, Outcome.NO_BOOKMARK, Outcome.PROVED, Outcome.NO_BOOKMARK,
                        Outcome.FAILED, Outcome.NO_BOOKMARK, Outcome.NO_BOOKMARK):  # fmt: skip
            done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            done.set_result(outcome)
            prober._ended(done)  # type: ignore[arg-type]
            seen.append(prober.unprovable)
        return seen

    assert run(go()) == [False, False, False, False, False, False, True]

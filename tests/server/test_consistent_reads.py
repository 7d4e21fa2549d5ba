"""Consistent reads in the handler: a GET goes to the upstream (as kube's goes to etcd), a LIST or watch
waits for its scope's proof (``freshness.reach_scope``) and passes through without one; a waiting read
holds no in-flight seat."""

from __future__ import annotations

import asyncio
import contextlib

from harness.waiting import until
from tests.support.factories import pod
from tests.support.handlers import DELETED, Harness, arun, background
from watchcache import apierrors
from watchcache.http.request import Request
from watchcache.server.seats import Seat


def feed_later(h: Harness) -> None:
    """The upstream committed rv 11 (p0 deleted); the cache sees it once the read's proof is under way.
    A condition, not a delay: the order holds on a busy machine."""
    h.upstream.rv = 11
    up = h.upstream

    async def feed() -> None:
        await until(lambda: up.proving_now > 0)
        h.cacher.apply([(DELETED, pod("p0", rv=11))])

    background(feed())


@arun
async def test_a_consistent_list_is_proven_for_its_namespace_and_served_from_the_cache() -> None:
    h = Harness(fresh_wait=2.0)
    feed_later(h)
    resp = await h.list()
    assert resp.status == 200 and "p0" not in [i["metadata"]["name"] for i in resp.json()["items"]]
    assert h.upstream.scope_proofs == ["default"] and h.upstream.forwarded == []
    assert h.upstream.consistent_calls == 1  # no limit=1 LIST, no probe: the scope's proof alone


@arun
async def test_a_consistent_list_of_every_namespace_is_proven_for_all() -> None:
    h = Harness(fresh_wait=2.0)
    resp = await h.request("/api/v1/pods")
    assert resp.status == 200 and h.upstream.scope_proofs == [None]


@arun
async def test_a_consistent_list_without_a_proof_passes_through() -> None:
    h = Harness(fresh_wait=0.1)
    h.upstream.rv = 20  # the cache will not get there
    resp = await h.list(limit="2")
    assert resp.status == 404  # FakeUpstream.forward: the request went to the upstream
    assert h.upstream.forwarded == ["/api/v1/namespaces/default/pods"]


@arun
async def test_a_consistent_watch_is_proven_like_a_list() -> None:
    h = Harness(fresh_wait=2.0)
    feed_later(h)
    resp = await h.watch()
    assert resp.status == 200 and h.upstream.scope_proofs == ["default"]
    names = [e["object"]["metadata"]["name"] for e in resp.events()]
    assert "p0" not in names and len(names) == 4  # the initial state at rv 11


@arun
async def test_a_consistent_get_goes_to_the_upstream_at_once_as_kube_sends_it_to_etcd() -> None:
    h = Harness(fresh_wait=2.0)
    h.upstream.delegates_consistent_gets = True
    resp = await h.get("p1")
    assert resp.status == 404 and h.upstream.forwarded == ["/api/v1/namespaces/default/pods/p1"]
    assert h.upstream.scope_proofs == [] and h.upstream.consistent_calls == 0
    resp = await h.get("p1", resourceVersion="0")  # any rv: from the cache
    assert resp.status == 200 and resp.json()["metadata"]["name"] == "p1"
    assert h.handler.passed_through == {"consistent-get": 1}


GET_P1 = "/api/v1/namespaces/default/pods/p1"


def early_harness() -> Harness:
    """A proxy's handler (consistent GETs delegated) whose upstream takes GETs sent early."""
    h = Harness(fresh_wait=2.0)
    h.upstream.delegates_consistent_gets = True
    h.upstream.sent_early = []
    return h


@arun
async def test_an_idle_worker_sends_a_consistent_get_before_its_handler_runs_which_then_takes_it() -> None:
    h = early_harness()
    req = h.make_request(GET_P1)
    h.handler.prestart(req)  # the protocol's hook, at the end of the request, before the handler's task
    assert h.upstream.sent_early == [GET_P1] and h.upstream.forwarded == []  # out before any handler step
    resp = await h.send(req)
    assert resp.status == 404 and h.upstream.forwarded == [GET_P1]  # its answer, passed back
    assert h.handler.sent_early == {"used": 1, "dropped": 0}
    assert h.handler.passed_through == {"consistent-get": 1}


@arun
async def test_only_a_consistent_get_the_upstream_answers_goes_early() -> None:
    h = early_harness()
    for req in (
        h.make_request(GET_P1, {"resourceVersion": "0"}),  # from the cache
        h.make_request("/api/v1/namespaces/default/pods"),  # a consistent LIST: proven, from the cache
        h.make_request("/api/v1/namespaces/default/pods", {"watch": "1"}),
        h.make_request("/api/v1/namespaces/default/pods", method="POST"),
        h.make_request("/api/v1/namespaces/default/configmaps/c"),  # not cached: passed through, as before
        h.make_request("/api"),
    ):
        h.handler.prestart(req)
    assert h.upstream.sent_early == []
    h.handler.shutting_down = True  # its answer is a 429: nothing goes upstream
    h.handler.prestart(h.make_request(GET_P1))
    h.handler.shutting_down = False
    h.upstream.delegates_consistent_gets = False  # the simulated cluster answers every GET itself
    h.handler.prestart(h.make_request(GET_P1))
    assert h.upstream.sent_early == []


@arun
async def test_a_get_goes_early_only_while_nothing_else_holds_a_seat_or_waits_for_the_upstream() -> None:
    h = early_harness()
    first, second = h.make_request(GET_P1), h.make_request(GET_P1)
    h.handler.prestart(first)
    h.handler.prestart(second)  # the first is still at the upstream, unanswered
    assert h.upstream.sent_early == [GET_P1] and second.early is None
    first.early.answered = True  # type: ignore[attr-defined]
    seat = Seat(h.handler.seats, "readOnly")  # another request at work
    h.handler.prestart(second)
    assert second.early is None
    seat.release()
    h.handler.prestart(second)
    assert h.upstream.sent_early == [GET_P1, GET_P1] and second.early is not None
    assert (await h.send(first)).status == 404 and (await h.send(second)).status == 404
    assert h.handler.sent_early == {"used": 2, "dropped": 0}


@arun
async def test_an_early_get_whose_handler_ends_otherwise_is_dropped() -> None:
    h = early_harness()

    def unavailable(request: Request) -> None:
        raise apierrors.StatusError(503, "ServiceUnavailable", "injected")

    h.handler.admission.append(unavailable)
    req = h.make_request(GET_P1)
    h.handler.prestart(req)
    early = req.early
    resp = await h.send(req)
    assert resp.status == 503 and h.upstream.forwarded == []
    assert early.taken and req.early is None  # type: ignore[attr-defined] # its answer, if any, dropped
    assert h.handler.sent_early == {"used": 0, "dropped": 1}


@arun
async def test_an_early_get_whose_task_is_cancelled_before_it_runs_is_dropped_at_the_tasks_end() -> None:
    """An HTTP/2 stream reset in the same read as its HEADERS cancels its task before its first step:
    no handler takes the GET sent early, so the task's end drops it, and the worker sends early again."""
    h = early_harness()
    req = h.make_request(GET_P1)
    task = asyncio.get_running_loop().create_task(h.send(req))
    h.handler.prestart(req, task)
    early = req.early
    assert early is not None and h.upstream.sent_early == [GET_P1]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)  # (its done callbacks)
    assert early.taken and req.early is None  # type: ignore[attr-defined]
    assert h.handler.sent_early == {"used": 0, "dropped": 1}
    h.handler.prestart(h.make_request(GET_P1))
    assert h.upstream.sent_early == [GET_P1, GET_P1]


@arun
async def test_an_early_get_whose_handler_ran_is_settled_once_not_again_at_its_tasks_end() -> None:
    h = early_harness()
    req = h.make_request(GET_P1)
    task = asyncio.get_running_loop().create_task(h.send(req))
    h.handler.prestart(req, task)
    assert (await task).status == 404
    await asyncio.sleep(0)
    assert h.handler.sent_early == {"used": 1, "dropped": 0}


@arun
async def test_a_read_waiting_for_its_proof_holds_no_seat() -> None:
    """With one seat, a read waiting for a proof leaves it to a read that can be answered now."""
    h = Harness(fresh_wait=2.0, max_requests_inflight=1)
    h.upstream.rv = 11  # the cache is behind until the test feeds it
    waiting = asyncio.ensure_future(h.list())
    await until(lambda: h.upstream.proving_now == 1)
    assert h.handler.active == 0 and h.handler.seats.waiting == 1
    ready = await h.list(resourceVersion="0")  # would have been 429 while the wait held the seat
    assert ready.status == 200
    h.cacher.apply([(DELETED, pod("p0", rv=11))])
    assert (await waiting).status == 200
    assert h.handler.active == 0 and h.handler.seats.waiting == 0


@arun
async def test_a_waiting_read_keeps_its_seat_when_too_many_wait() -> None:
    h = Harness(fresh_wait=2.0, max_requests_inflight=1, max_requests_waiting=0)
    h.upstream.rv = 11
    waiting = asyncio.ensure_future(h.list())
    await until(lambda: h.upstream.proving_now == 1)
    assert h.handler.active == 1 and h.handler.seats.waiting == 0
    assert (await h.list(resourceVersion="0")).status == 429
    h.cacher.apply([(DELETED, pod("p0", rv=11))])
    assert (await waiting).status == 200 and h.handler.active == 0

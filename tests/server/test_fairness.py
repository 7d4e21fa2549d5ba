"""The handler with API Priority and Fairness: a request finding its level's seats busy waits in its
queue instead of a 429, gets kube's 429 (with the PF headers) only past its wait budget, and a watch's
seat goes back once it is registered. One seat per level (``--max-requests-inflight 1``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.test_limits import PODS, finish, start, until
from tests.support.factories import FakeResponse
from tests.support.handlers import MODIFIED, Harness, arun
from watchcache import apierrors
from watchcache.fairness.defaults import flow_schemas, priority_levels
from watchcache.http.request import Request
from watchcache.server import fairness

GLOBAL_DEFAULT = next(o["metadata"]["uid"] for o in flow_schemas() if o["metadata"]["name"] == "global-default")
GLOBAL_LEVEL = next(o["metadata"]["uid"] for o in priority_levels() if o["metadata"]["name"] == "global-default")


def pf(headers: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    found = dict(headers)
    return found.get(fairness.FLOW_SCHEMA_UID), found.get(fairness.PRIORITY_LEVEL_UID)


@arun
async def test_a_request_waits_for_the_seat_a_waiting_watch_holds_instead_of_a_429() -> None:
    h = Harness(fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0, priority_and_fairness=True)
    watch = start(h, PODS, {"watch": "1", "resourceVersion": "12"})  # no room to wait: it keeps its seat
    await until(lambda: h.cacher.waiting == 1)
    listing = start(h, PODS, {})
    control = h.handler.flow_control
    assert control is not None
    stats = control.stats[("global-default", "global-default")]
    await until(lambda: stats.inqueue == 1)
    assert listing[1].status is None, "the LIST was answered while the only seat was held"
    h.write(MODIFIED, "p1")
    h.write(MODIFIED, "p2")  # rv 12: the watch is registered and gives its seat back
    await until(lambda: listing[1].status is not None)
    assert listing[1].status == 200
    assert pf(listing[1].headers) == (GLOBAL_DEFAULT, GLOBAL_LEVEL)
    await finish(*listing)
    await finish(*watch)
    assert stats.executing == 0 and stats.rejected.get("time-out", 0) == 0


@arun
async def test_past_its_wait_budget_a_request_gets_kubes_429_with_the_pf_headers() -> None:
    # --request-timeout 0.4 s: a wait budget of 0.1 s.
    h = Harness(
        fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0, request_timeout=0.4, priority_and_fairness=True
    )
    waiting = start(h, PODS, {"resourceVersion": "20"})  # a LIST waiting for rv 20, holding the seat
    await until(lambda: h.cacher.waiting == 1)
    res = await h.list()
    assert res.status == 429
    # kube's tooManyRequests through Go's http.Error: plain text, nosniff, Retry-After.
    assert res.body == b"Too many requests, please try again later.\n"
    assert res.content_type == "text/plain; charset=utf-8"
    assert ("Retry-After", "1") in res.headers
    assert ("X-Content-Type-Options", "nosniff") in res.headers
    assert pf(res.headers) == (GLOBAL_DEFAULT, GLOBAL_LEVEL)
    assert h.handler.rejected["priority_and_fairness"] == 1
    h.cacher.progress(20)
    await finish(*waiting)


def test_wait_budget_is_kubes() -> None:
    assert fairness.wait_budget(60, False) == 15  # a quarter of the request timeout
    assert fairness.wait_budget(600, False) == 60  # at most a minute
    assert fairness.wait_budget(60, True) == 15  # a watch: no deadline, kube's default
    assert fairness.wait_budget(0, False) == 15


def test_without_a_gate_credentials_stand_for_the_user() -> None:
    def req(headers: dict[str, str], cert: dict | None = None) -> Request:
        return Request("GET", b"/api", "/api", {}, headers, b"", "1.1", "t", peercert=cert)

    token = fairness._unverified_user(req({"authorization": "Bearer abc"}))
    assert token.username.startswith("token:") and "system:authenticated" in token.groups
    assert token == fairness._unverified_user(req({"authorization": "Bearer abc"}))
    assert token != fairness._unverified_user(req({"authorization": "Bearer abd"}))
    cert = {"subject": ((("commonName", "system:node:n1"),), (("organizationName", "system:nodes"),))}
    node = fairness._unverified_user(req({}, cert))
    assert (node.username, node.groups) == ("system:node:n1", ("system:nodes", "system:authenticated"))
    assert fairness._unverified_user(req({})).username == "system:anonymous"


def test_the_handler_builds_no_flow_control_when_off() -> None:
    async def run() -> None:
        assert Harness().handler.flow_control is None
        assert Harness(priority_and_fairness=True).handler.flow_control is not None

    asyncio.run(run())


@arun
async def test_a_request_admitted_before_its_body_is_handled_with_that_grant_not_admitted_again() -> None:
    # The HTTP layer's ``admit`` (a request whose body is to come): the wait happens there, the handler
    # then runs with ``request.admitted`` and does not queue it a second time.
    h = Harness(fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0, priority_and_fairness=True)
    control, admit = h.handler.flow_control, h.handler.admit
    assert control is not None and admit is not None
    waiting = start(h, PODS, {"resourceVersion": "20"})  # holds the only seat
    await until(lambda: h.cacher.waiting == 1)
    stats = control.stats[("global-default", "global-default")]
    req = Request("GET", PODS.encode(), PODS, {}, {"content-length": "2"}, b"", "1.1", "test")
    resp = FakeResponse()
    admission = asyncio.ensure_future(admit(req, resp))
    await until(lambda: stats.inqueue == 1)
    h.cacher.progress(20)  # the LIST ends: its seat goes to the queued request
    admitted = await admission
    assert admitted is not None and stats.executing == 1 and stats.dispatched == 2
    req.admitted, req.body = admitted, b"{}"
    await h.handler(req, resp)
    assert resp.status == 200 and pf(resp.headers) == (GLOBAL_DEFAULT, GLOBAL_LEVEL)
    assert stats.dispatched == 2 and stats.executing == 0  # not admitted twice; its seat is back
    await finish(*waiting)


@arun
async def test_a_request_refused_before_its_body_gets_kubes_429_from_admit() -> None:
    h = Harness(
        fresh_wait=3.0, max_requests_inflight=1, max_requests_waiting=0, request_timeout=0.4, priority_and_fairness=True
    )
    admit = h.handler.admit
    assert admit is not None
    waiting = start(h, PODS, {"resourceVersion": "20"})
    await until(lambda: h.cacher.waiting == 1)
    resp = FakeResponse()
    req = Request("POST", PODS.encode(), PODS, {}, {"content-length": "2"}, b"", "1.1", "test")
    assert await admit(req, resp) is None  # answered: the body is never read
    assert resp.status == 429 and ("Retry-After", "1") in resp.headers
    assert pf(resp.headers) == (GLOBAL_DEFAULT, GLOBAL_LEVEL)
    h.handler.shutting_down = True
    with pytest.raises(apierrors.StatusError) as e:
        await admit(req, FakeResponse())
    assert e.value.code == 429
    h.cacher.progress(20)
    await finish(*waiting)


@arun
async def test_a_flows_pass_throughs_past_its_levels_seats_wait_their_turn_without_a_seat() -> None:
    """A flow has as many pass-throughs at the upstream as its level has seats; the next waits in its
    flow's line for one of them to be answered, holding no seat, so another flow's request neither
    queues for a seat nor waits behind the flood (which reaches the upstream, and this worker's loop,
    a level's seats at a time); a wait past a queue's is kube's 429."""
    h = Harness(max_requests_inflight=1, priority_and_fairness=True, request_timeout=1.0)
    control = h.handler.flow_control
    assert control is not None
    level = control.levels["global-default"]
    assert level.queueset is not None
    level.queueset.set_limit(1)
    h.upstream.hold = asyncio.Event()

    async def send(token: str, upgrade: str | None = None) -> FakeResponse:
        path = "/api/v1/namespaces/a/configmaps"  # not cached: passed through
        req = Request("GET", path.encode(), path, {}, {"authorization": f"Bearer {token}"}, b"", "1.1", "t")
        req.upgrade = upgrade
        resp = FakeResponse()
        try:
            await h.handler(req, resp)
        except apierrors.StatusError as e:  # as the server renders it
            resp.send(e.code, e.body())
        return resp

    first = asyncio.create_task(send("noisy"))
    await until(lambda: len(h.upstream.forwarded) == 1)
    assert level.queueset.executing == 0, "the flow's first pass-through held its seat at the upstream"
    # A tunnel (exec) holds no seat and takes no turn, for as long as its user keeps it (--max-tunnels).
    tunnel = asyncio.create_task(send("noisy", upgrade="websocket"))
    await until(lambda: len(h.upstream.forwarded) == 2)
    second = asyncio.create_task(send("noisy"))
    third = asyncio.create_task(send("noisy"))
    await until(lambda: len(control.upstream_line.get(next(iter(control.upstream_turns)), ())) == 2)
    assert len(h.upstream.forwarded) == 2, "a flow had more pass-throughs at the upstream than its level's seats"
    assert level.queueset.executing == 0, "a pass-through waiting for its flow's turn held a seat"
    quiet = asyncio.create_task(send("quiet"))  # another flow: its own turns, at once
    await until(lambda: len(h.upstream.forwarded) == 3)
    stats = control.stats[("global-default", "global-default")]
    assert stats.inqueue == 0
    responses = await asyncio.gather(second, third)  # their turn did not come within a queue's wait
    assert [r.status for r in responses] == [429, 429]
    assert responses[0].body == fairness.REJECTED_BODY and pf(responses[0].headers) == (GLOBAL_DEFAULT, GLOBAL_LEVEL)
    assert stats.rejected == {"time-out": 2}
    fourth = asyncio.create_task(send("noisy"))
    await until(lambda: sum(len(line) for line in control.upstream_line.values()) == 1)
    h.upstream.hold.set()  # the first's answer came: the fourth's turn
    responses = await asyncio.gather(first, tunnel, quiet, fourth)
    assert [r.status for r in responses] == [404] * 4 and len(h.upstream.forwarded) == 4
    assert control.upstream_turns == {} and control.upstream_line == {}
    assert stats.executing == 0 and h.handler.seats.waiting == 0

"""One test per cell of the reference's resourceVersion tables (get, list, watch).

Names follow the tables: ``test_<op>_<resourceVersionMatch>_<paging>_<resourceVersion>_<semantic>``.
Each test checks the behaviour that distinguishes its semantic, not just the status code:

* Most Recent: waits until the cache has the upstream's current rv, so it never returns older data;
* Any: answers from the cache at once, without asking the upstream;
* Not older than: the answer's rv is >= the requested one (waiting for it, 504 if it never comes);
* Exact: the answer is the state at exactly that rv, even after later writes;
* Continue Token, Exact: the next page is read at the token's rv.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.factories import pod
from tests.support.handlers import DELETED, MODIFIED, Harness, arun, background, until


def names(resp) -> list[str]:
    return [i["metadata"]["name"] for i in resp.json()["items"]]


def rv_of(resp) -> int:
    return int(resp.json()["metadata"]["resourceVersion"])


async def upstream_ahead(h: Harness) -> int:
    """The upstream committed rv 11 (p0 deleted) but the cache has not seen it yet; it will once
    the read under test is in the server's hands (waiting for the proof that it is fresh)."""
    h.upstream.rv = 11

    async def feed() -> None:
        await until(lambda: h.handler.inflight > 0)
        h.rv = 11
        h.cacher.apply([(DELETED, pod("p0", rv=11))])

    background(feed())
    return 11


async def assert_most_recent(h: Harness, **query) -> None:
    await upstream_ahead(h)
    resp = await h.list(**query)
    assert resp.status == 200
    assert rv_of(resp) >= 11 and "p0" not in names(resp)
    assert h.upstream.consistent_calls == 1


async def assert_any(h: Harness, **query) -> None:
    h.upstream.rv = 99  # the upstream is far ahead; Any must not wait for it
    resp = await h.list(**query)
    assert resp.status == 200 and rv_of(resp) == 10
    assert h.upstream.consistent_calls == 0


async def assert_not_older_than(h: Harness, **query) -> None:
    h.write(MODIFIED, "p1", labels={"i": "1", "new": "y"})  # cache at 11
    resp = await h.list(resourceVersion="10", **query)
    assert resp.status == 200 and rv_of(resp) >= 10
    # and a future rv is waited for, then refused with 504 Too large resource version
    late = await h.list(resourceVersion="50", **query)
    assert late.status == 504 and late.json()["reason"] == "Timeout"
    assert late.json()["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    assert late.json()["details"]["retryAfterSeconds"] == 1


async def assert_exact(h: Harness, **query) -> None:
    h.write(DELETED, "p1")  # rv 11
    h.write(MODIFIED, "p2", labels={"i": "0", "changed": "y"})  # rv 12
    resp = await h.list(resourceVersion="10", **query)
    assert resp.status == 200 and rv_of(resp) == 10
    items = resp.json()["items"]
    assert "p1" in [i["metadata"]["name"] for i in items]
    p2 = next(i for i in items if i["metadata"]["name"] == "p2")
    assert "changed" not in p2["metadata"]["labels"]


async def assert_invalid(h: Harness, field_msg: str, **query) -> None:
    resp = await h.list(**query)
    assert resp.status == 422
    body = resp.json()
    assert body["reason"] == "Invalid" and body["kind"] == "Status"
    assert field_msg in body["message"]


async def first_page_then_writes(h: Harness) -> str:
    first = await h.list(limit="2")
    assert names(first) == ["p0", "p1"] and first.json()["metadata"]["remainingItemCount"] == 3
    h.write(DELETED, "p2")
    h.write(MODIFIED, "p3", labels={"i": "1", "changed": "y"})
    return first.json()["metadata"]["continue"]


async def assert_continue_exact(h: Harness, token: str, **query) -> None:
    resp = await h.list(limit="2", **{"continue": token}, **query)
    assert resp.status == 200 and rv_of(resp) == 10
    assert names(resp) == ["p2", "p3"]
    assert "changed" not in resp.json()["items"][1]["metadata"]["labels"]


# ---------------------------------------------------------------- list: resourceVersionMatch unset, limit unset


@arun
async def test_list_match_unset_limit_unset_rv_unset_most_recent():
    await assert_most_recent(Harness())


@arun
async def test_list_match_unset_limit_unset_rv_0_any():
    await assert_any(Harness(), resourceVersion="0")


@arun
async def test_list_match_unset_limit_unset_rv_n_not_older_than():
    await assert_not_older_than(Harness())


# ---------------------------------------------------------------- list: match unset, limit=n, continue unset


@arun
async def test_list_match_unset_limit_n_rv_unset_most_recent():
    h = Harness()
    await upstream_ahead(h)
    resp = await h.list(limit="2")
    assert rv_of(resp) == 11 and names(resp) == ["p1", "p2"] and h.upstream.consistent_calls == 1


@arun
async def test_list_match_unset_limit_n_rv_0_any():
    h = Harness()
    await assert_any(h, resourceVersion="0", limit="2")


@arun
async def test_list_match_unset_limit_n_rv_n_exact():
    await assert_exact(Harness(), limit="10")


# ---------------------------------------------------------------- list: match unset, limit=n, continue=token


@arun
async def test_list_match_unset_continue_rv_unset_continue_token_exact():
    h = Harness()
    token = await first_page_then_writes(h)
    await assert_continue_exact(h, token)


@arun
async def test_list_match_unset_continue_rv_0_invalid_treated_as_continue_token_exact():
    h = Harness()
    token = await first_page_then_writes(h)
    await assert_continue_exact(h, token, resourceVersion="0")


@arun
async def test_list_match_unset_continue_rv_n_invalid_400_bad_request():
    h = Harness()
    token = await first_page_then_writes(h)
    resp = await h.list(limit="2", resourceVersion="10", **{"continue": token})
    assert resp.status == 400 and resp.json()["reason"] == "BadRequest"
    assert resp.json()["message"] == "specifying resource version is not allowed when using continue"


# ---------------------------------------------------------------- list: resourceVersionMatch=Exact


@arun
async def test_list_match_exact_limit_unset_rv_unset_invalid():
    await assert_invalid(
        Harness(), "resourceVersionMatch is forbidden unless resourceVersion is provided", resourceVersionMatch="Exact"
    )


@arun
async def test_list_match_exact_limit_unset_rv_0_invalid():
    await assert_invalid(
        Harness(),
        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
        resourceVersionMatch="Exact",
        resourceVersion="0",
    )


@arun
async def test_list_match_exact_limit_unset_rv_n_exact():
    await assert_exact(Harness(), resourceVersionMatch="Exact")


@arun
async def test_list_match_exact_limit_n_rv_unset_invalid():
    await assert_invalid(
        Harness(),
        "resourceVersionMatch is forbidden unless resourceVersion is provided",
        resourceVersionMatch="Exact",
        limit="2",
    )


@arun
async def test_list_match_exact_limit_n_rv_0_invalid():
    await assert_invalid(
        Harness(), 'forbidden for resourceVersion "0"', resourceVersionMatch="Exact", resourceVersion="0", limit="2"
    )


@arun
async def test_list_match_exact_limit_n_rv_n_exact():
    await assert_exact(Harness(), resourceVersionMatch="Exact", limit="10")


# ---------------------------------------------------------------- list: resourceVersionMatch=NotOlderThan


@arun
async def test_list_match_not_older_than_limit_unset_rv_unset_invalid():
    await assert_invalid(
        Harness(),
        "resourceVersionMatch is forbidden unless resourceVersion is provided",
        resourceVersionMatch="NotOlderThan",
    )


@arun
async def test_list_match_not_older_than_limit_unset_rv_0_any():
    await assert_any(Harness(), resourceVersionMatch="NotOlderThan", resourceVersion="0")


@arun
async def test_list_match_not_older_than_limit_unset_rv_n_not_older_than():
    await assert_not_older_than(Harness(), resourceVersionMatch="NotOlderThan")


@arun
async def test_list_match_not_older_than_limit_n_rv_unset_invalid():
    await assert_invalid(
        Harness(),
        "resourceVersionMatch is forbidden unless resourceVersion is provided",
        resourceVersionMatch="NotOlderThan",
        limit="2",
    )


@arun
async def test_list_match_not_older_than_limit_n_rv_0_any():
    await assert_any(Harness(), resourceVersionMatch="NotOlderThan", resourceVersion="0", limit="2")


@arun
async def test_list_match_not_older_than_limit_n_rv_n_not_older_than():
    h = Harness()
    h.write(MODIFIED, "p1", labels={"i": "1"})
    resp = await h.list(resourceVersionMatch="NotOlderThan", resourceVersion="10", limit="2")
    # served at the newest rv, not at 10: a paged NotOlderThan list is not Exact
    assert resp.status == 200 and rv_of(resp) == 11 and len(names(resp)) == 2


# ---------------------------------------------------------------- get


@arun
async def test_get_rv_unset_most_recent():
    h = Harness()
    await upstream_ahead(h)
    resp = await h.get("p0")
    assert resp.status == 404 and resp.json()["reason"] == "NotFound"  # deleted at rv 11, which it waited for
    assert resp.json()["message"] == 'pods "p0" not found'


@arun
async def test_get_rv_0_any():
    h = Harness()
    h.upstream.rv = 99
    resp = await h.get("p0", resourceVersion="0")
    assert resp.status == 200 and resp.json()["kind"] == "Pod" and resp.json()["apiVersion"] == "v1"
    assert h.upstream.consistent_calls == 0


@arun
async def test_get_rv_n_not_older_than():
    h = Harness()
    h.write(MODIFIED, "p1", labels={"v": "2"})
    resp = await h.get("p1", resourceVersion="10")
    assert resp.status == 200 and resp.json()["metadata"]["labels"] == {"v": "2"}
    late = await h.get("p1", resourceVersion="50")
    assert late.status == 504


# ---------------------------------------------------------------- watch


@arun
async def test_watch_rv_unset_get_state_and_start_at_most_recent():
    h = Harness()
    await upstream_ahead(h)  # p0 is deleted at 11, which the watch must wait for
    resp = await h.watch()
    events = resp.events()
    assert [e["type"] for e in events] == ["ADDED"] * 4
    assert sorted(e["object"]["metadata"]["name"] for e in events) == ["p1", "p2", "p3", "p4"]
    assert h.upstream.consistent_calls == 1


@arun
async def test_watch_rv_0_get_state_and_start_at_any():
    h = Harness()
    h.upstream.rv = 99
    resp = await h.watch(lambda: h.write(MODIFIED, "p1", labels={"i": "1"}), resourceVersion="0")
    events = resp.events()
    assert [e["type"] for e in events] == ["ADDED"] * 5 + ["MODIFIED"]
    assert events[-1]["object"]["metadata"]["resourceVersion"] == "11"
    assert h.upstream.consistent_calls == 0


@arun
async def test_watch_rv_n_start_at_exact():
    h = Harness()
    h.write(MODIFIED, "p1", labels={"i": "1"})  # 11
    h.write(DELETED, "p2")  # 12
    resp = await h.watch(resourceVersion="11")
    events = resp.events()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "p2")]
    assert events[0]["object"]["metadata"]["resourceVersion"] == "12"


def test_tables_have_one_test_per_cell():
    cells = [n for n in globals() if n.startswith(("test_list_", "test_get_", "test_watch_"))]
    assert len([c for c in cells if c.startswith("test_list_")]) == 21
    assert len([c for c in cells if c.startswith("test_get_")]) == 3
    assert len([c for c in cells if c.startswith("test_watch_")]) == 3


@pytest.mark.parametrize("rv", ["abc", "-1", "1.5", "99999999999999999999999"])
def test_non_numeric_resource_version_is_400(rv):
    async def go():
        return await Harness().list(resourceVersion=rv)

    resp = asyncio.run(go())
    assert resp.status == 400 and resp.json()["reason"] == "BadRequest"


@arun
async def test_continue_at_an_rv_whose_group_grew_since_the_first_page_is_410_with_an_inconsistent_token():
    # An upstream watch cache's group of events at 11, split across two reads: a chunked LIST
    # started between them read the first part; its next page must not read the whole group.
    h = Harness()
    h.cacher.apply([(DELETED, pod("p0", rv=11))])
    first = (await h.list(limit="2")).json()
    assert first["metadata"]["resourceVersion"] == "11"
    h.cacher.apply([(DELETED, pod("p3", rv=11))])  # the rest of the group
    resp = await h.list(limit="2", **{"continue": first["metadata"]["continue"]})
    assert resp.status == 410 and resp.json()["reason"] == "Expired", resp.json()
    assert resp.json()["metadata"]["continue"]  # kube's "inconsistent" token, to go on regardless
    # A LIST started after the whole group came pages through consistently.
    again = (await h.list(limit="2")).json()
    rest = await h.list(limit="10", **{"continue": again["metadata"]["continue"]})
    assert rest.status == 200
    names = [p["metadata"]["name"] for p in again["items"] + rest.json()["items"]]
    assert names == ["p1", "p2", "p4"]

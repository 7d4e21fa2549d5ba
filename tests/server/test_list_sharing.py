"""Identical LISTs at one snapshot share one built answer (a relist storm), and never a stale one.

``dispatch/bodies.py`` ``ListBodies``, one per ``Cacher``: an answer is keyed by its snapshot's rv and
the request's own terms (namespace, selectors, limit, continue start, encoding). The property test runs random
writes and LISTs and checks each answer against one built afresh from the same snapshot.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.handlers import DELETED, MODIFIED, Harness, arun
from watchcache.dispatch import lists
from watchcache.dispatch.bodies import ListBodies


def counting_list_page(monkeypatch: Any) -> list[int]:
    calls = [0]
    real = lists.list_page

    def counted(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(lists, "list_page", counted)
    return calls


def test_identical_lists_at_one_snapshot_are_built_once(monkeypatch: Any) -> None:
    calls = counting_list_page(monkeypatch)

    @arun
    async def scenario() -> None:
        h = Harness()
        first = await h.list(resourceVersion="0")
        again = [await h.list(resourceVersion="0") for _ in range(5)]
        assert calls[0] == 1  # without sharing: 6
        assert all(r.body == first.body for r in again)
        assert h.cacher.list_bodies.shared == 5
        # Different terms are different answers.
        labelled = await h.list(resourceVersion="0", labelSelector="i=1")
        assert calls[0] == 2 and labelled.body != first.body
        # A write moves the snapshot on: built anew, and it shows the write.
        h.write(MODIFIED, "p9")
        after = await h.list(resourceVersion="0")
        assert calls[0] == 3
        assert "p9" in [i["metadata"]["name"] for i in after.json()["items"]]

    scenario()


def test_a_continue_page_of_an_older_snapshot_is_served_and_not_kept() -> None:
    @arun
    async def scenario() -> None:
        h = Harness()
        page = await h.list(limit="2")
        token = page.json()["metadata"]["continue"]
        h.write(MODIFIED, "p7")  # newer snapshot
        await h.list(resourceVersion="0")
        bodies = h.cacher.list_bodies
        newest = bodies.version
        rest = await h.list(limit="2", **{"continue": token})
        assert [i["metadata"]["name"] for i in rest.json()["items"]] == ["p2", "p3"]
        assert bodies.version == newest  # the older snapshot's page did not replace the newest answers

    scenario()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from([MODIFIED, DELETED]), st.integers(0, 7), st.integers(0, 2)),
        st.tuples(
            st.just("list"),
            st.sampled_from(["", "i=0", "i=1"]),
            st.sampled_from(["", "spec.nodeName=n1", "metadata.name=p3"]),
            st.sampled_from(["0", "", "exact"]),
            st.sampled_from(["", "2"]),
        ),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_a_shared_answer_is_the_answer_built_afresh(ops: list[tuple[Any, ...]]) -> None:
    @arun
    async def scenario() -> None:
        h = Harness()
        rvs = [h.rv]
        for op in ops:
            if op[0] == "write":
                _, kind, i, node = op
                rvs.append(h.write(kind, f"p{i}", node=f"n{node}"))
                continue
            _, labels, fields, rv, limit = op
            query: dict[str, str] = {}
            if labels:
                query["labelSelector"] = labels
            if fields:
                query["fieldSelector"] = fields
            if rv == "exact":
                query.update(resourceVersion=str(rvs[len(rvs) // 2]), resourceVersionMatch="Exact")
            elif rv:
                query["resourceVersion"] = rv
            if limit:
                query["limit"] = limit
            for _ in range(2):  # the second may be shared; both must be what a fresh build gives
                got = await h.list(**query)
                h.cacher.list_bodies = ListBodies()
                fresh = await h.list(**query)
                assert got.status == fresh.status
                assert got.body == fresh.body, query

    scenario()

"""A kubelet's LIST (``fieldSelector=spec.nodeName=<node>``) reads its node's pods, not every pod.

kube-apiserver's cacher indexes pods by spec.nodeName for LISTs; so does the cache here
(cache/store.py, "Index"). ``apiserver_cache_list_fetched_objects_total`` counts the objects a
LIST examined, as kube's does: with the index, the node's pods only.
"""

from __future__ import annotations

import pytest

from tests.support.handlers import MODIFIED, Harness, arun


def names(resp) -> list[str]:  # type: ignore[no-untyped-def]
    assert resp.status == 200, resp.body
    return [item["metadata"]["name"] for item in resp.json()["items"]]


@pytest.mark.parametrize("rv", ["0", None])
@arun
async def test_a_list_by_node_examines_only_that_nodes_pods(rv: str | None) -> None:
    h = Harness()
    for i in range(40):
        h.write(MODIFIED, f"n{i}", node=f"node-{i % 8}")
    fetched = h.cacher.list_fetched
    query = {"fieldSelector": "spec.nodeName=node-3", **({"resourceVersion": rv} if rv is not None else {})}
    got = names(await h.request("/api/v1/pods", query))
    assert got == sorted(f"n{i}" for i in range(40) if i % 8 == 3)
    assert h.cacher.list_fetched - fetched == 5


@arun
async def test_a_list_by_node_at_an_older_rv_sees_the_pods_that_were_there() -> None:
    h = Harness()
    h.write(MODIFIED, "a", node="n1")
    before = h.write(MODIFIED, "b", node="n1")
    h.write(MODIFIED, "a", node="n2")  # moved away after `before`
    h.write(MODIFIED, "c", node="n1")  # arrived after `before`
    query = {"fieldSelector": "spec.nodeName=n1", "resourceVersion": str(before), "resourceVersionMatch": "Exact"}
    assert names(await h.request("/api/v1/pods", query)) == ["a", "b"]
    assert names(await h.request("/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"})) == ["b", "c"]


@arun
async def test_a_paged_list_by_node_continues_through_the_index() -> None:
    h = Harness()
    for i in range(9):
        h.write(MODIFIED, f"q{i}", node="n1" if i % 3 else "n2")
    seen: list[str] = []
    query: dict[str, str] = {"fieldSelector": "spec.nodeName=n1", "limit": "2"}
    while True:
        resp = await h.request("/api/v1/pods", query)
        seen += names(resp)
        token = resp.json()["metadata"].get("continue")
        if not token:
            break
        query = {"fieldSelector": "spec.nodeName=n1", "limit": "2", "continue": token}
    assert seen == [f"q{i}" for i in range(9) if i % 3]

"""The reflector's event handling, without a network: lines in, cache calls out."""

import asyncio

import orjson
import pytest

from harness.doubles import NullSink
from harness.waiting import until
from tests.support.factories import pod
from watchcache.backoff import Backoff
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.upstream.client import UpstreamError, WatchStalled
from watchcache.upstream.discovery import ResourceResolutionError, parse_resource_id
from watchcache.upstream.reflector import Gone, Reflector, ReflectorConfig


def line(kind: str, obj: dict) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


def pod_json(name: str, rv: int) -> dict:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "d", "resourceVersion": str(rv)}}


def reflector() -> Reflector:
    async def make():
        cacher = Cacher(PODS)
        cacher.replace([pod("a", "d", 1)], 10)
        return Reflector(client=None, cacher=cacher)  # type: ignore[arg-type]

    return asyncio.run(make())


def test_events_apply_as_one_batch_and_bookmarks_progress():
    r = reflector()
    r._apply(
        [
            line("ADDED", pod_json("b", 11)),
            line("MODIFIED", pod_json("a", 12)),
            line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "20"}}),
        ]
    )
    assert r.cacher.rv == 20
    assert [e.rv for e in r.cacher.cache.events_since(10)] == [11, 12]


def test_repeated_events_at_or_below_the_cache_rv_are_skipped():
    r = reflector()
    r._apply([line("ADDED", pod_json("b", 11))])
    r._apply([line("ADDED", pod_json("b", 11)), line("MODIFIED", pod_json("b", 12))])
    assert [e.rv for e in r.cacher.cache.events_since(10)] == [11, 12]


def keys(r: Reflector) -> list[str]:
    return [o.key for o in r.cacher.cache.snapshot().iter_range("", None)]


def test_a_group_of_events_sharing_an_rv_is_applied_whole():
    # An upstream that is itself a watch cache stamps the deletions of its relist diffs with one rv.
    r = reflector()
    r._apply([line("ADDED", pod_json(n, rv)) for n, rv in (("b", 11), ("c", 12), ("e", 13))])
    r._apply([line("DELETED", pod_json(n, 20)) for n in ("b", "c", "e")])
    assert keys(r) == ["d/a"]
    assert [(e.type, e.object.name, e.rv) for e in r.cacher.cache.events_since(13)] == [
        ("DELETED", "b", 20),
        ("DELETED", "c", 20),
        ("DELETED", "e", 20),
    ]


def test_a_group_split_across_two_reads_is_applied_whole_and_a_repeat_of_it_is_skipped():
    r = reflector()
    r._apply([line("ADDED", pod_json(n, rv)) for n, rv in (("b", 11), ("c", 12), ("e", 13))])
    r._apply([line("DELETED", pod_json("b", 20))])  # the read ends inside the group
    r._apply([line("DELETED", pod_json("b", 20)), line("DELETED", pod_json("c", 20))])  # b again: a repeat
    r._apply(
        [line("DELETED", pod_json("e", 20)), line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "21"}})]
    )
    assert keys(r) == ["d/a"] and r.cacher.rv == 21
    assert [e.object.name for e in r.cacher.cache.events_since(13)] == ["b", "c", "e"]


def test_an_event_at_a_bookmarked_or_listed_rv_is_skipped():
    r = reflector()  # listed at 10
    r._apply([line("ADDED", pod_json("b", 10))])
    r._apply(
        [line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "12"}}), line("ADDED", pod_json("c", 12))]
    )
    assert keys(r) == ["d/a"] and r.cacher.rv == 12


def test_error_410_event_raises_gone_after_applying_what_came_before():
    r = reflector()
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (5)"}
    with pytest.raises(Gone, match="too old"):
        r._apply([line("MODIFIED", pod_json("a", 11)), line("ERROR", status)])
    assert r.cacher.rv == 11


def test_other_error_events_raise_upstream_error():
    r = reflector()
    with pytest.raises(UpstreamError) as e:
        r._apply([line("ERROR", {"kind": "Status", "code": 500, "message": "boom"})])
    assert e.value.code == 500


@pytest.mark.parametrize(
    ("text", "gvr"),
    [
        ("pods", ("", "v1", "pods")),
        ("v1/pods", ("", "v1", "pods")),
        ("apps/v1/deployments", ("apps", "v1", "deployments")),
    ],
)
def test_resource_ids(text, gvr):
    assert parse_resource_id(text) == gvr


def test_bad_resource_id():
    with pytest.raises(ResourceResolutionError):
        parse_resource_id("a/b/c/d")


class StallingClient:
    """An upstream whose first watch goes silent (WatchStalled), then whose second delivers an event."""

    def __init__(self) -> None:
        self.watches: list[float] = []

    async def get_json(self, path, params=None, timeout=30.0):  # type: ignore[no-untyped-def]
        return {"metadata": {"resourceVersion": "10"}, "items": [pod_json("a", 10)]}

    async def watch_into(self, resource, params, on_lines, *, stall_timeout, **_options):  # type: ignore[no-untyped-def]
        self.watches.append(asyncio.get_running_loop().time())
        if len(self.watches) == 1:
            raise WatchStalled("no data for 5s")
        on_lines([line("ADDED", pod_json("b", 11))])
        await asyncio.sleep(3600)


def test_a_stalled_watch_is_watched_again_at_once_whatever_the_backoff():
    async def main() -> None:
        cacher = Cacher(PODS)
        client = StallingClient()
        # Any backoff would be 2.5-5 s here.
        r = Reflector(client=client, cacher=cacher, config=ReflectorConfig(backoff_initial=5.0))  # type: ignore[arg-type]
        task = asyncio.ensure_future(r.run())
        try:
            await until(lambda: cacher.rv == 11)  # the second watch delivered
            assert len(client.watches) == 2 and client.watches[1] - client.watches[0] < 0.5
            assert r.watch_restarts == 1
        finally:
            task.cancel()

    asyncio.run(main())


def test_a_successful_list_resets_the_backoff():
    b = Backoff(0.2, 30.0)
    for _ in range(8):
        b.next()
    assert b.next() > 10  # what a reflector that failed a while would wait next

    async def main() -> float:
        cacher = Cacher(PODS)
        client = StallingClient()
        r = Reflector(client=client, cacher=cacher)  # type: ignore[arg-type]
        for _ in range(8):
            r.backoff.next()
        task = asyncio.ensure_future(r.run())
        await until(lambda: client.watches)  # it has listed, and watches
        task.cancel()
        return r.backoff.next()

    assert asyncio.run(main()) <= 0.2


def test_a_tiers_relist_diff_is_taken_as_one_relist_whatever_the_reads():
    """Inner tier relists; its frames reach the outer tier's reflector one line per read.

    Applied event by event, the diff would give the outer tier states the upstream never had
    (the deletions' rvs are stamped). Announced, it is buffered and applied as one relist at
    the same rv: no intermediate state, the same frames for the outer tier's own watchers,
    history restarting at the same rv.
    """
    from watchcache.cache.predicate import SelectionPredicate
    from watchcache.watchers.watcher import Watcher

    def watcher(c: Cacher) -> Watcher:
        w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), c.rv, NullSink(), allow_bookmarks=True)
        c.add_watcher(w)
        return w

    async def run() -> None:
        start = [pod("a", "d", 1), pod("b", "d", 2), pod("c", "d", 3), pod("m", "d", 4)]
        inner, outer = Cacher(PODS), Cacher(PODS)
        inner.replace(start, 10)
        outer.replace(start, 10)
        r = Reflector(client=None, cacher=outer)  # type: ignore[arg-type]
        to_outer, outer_client = watcher(inner), watcher(outer)
        # Upstream: n added at 11, b deleted at 12, c at 13, m modified at 14; inner relists at 15.
        inner.relist([pod("a", "d", 1), pod("m", "d", 14), pod("n", "d", 11)], 15)
        frames, _ = to_outer.take()
        lines = b"".join(frames).splitlines()
        assert b"relist-diff-end" in lines[0] and b'"BOOKMARK"' in lines[-1]
        for one in lines[:-1]:
            r._apply([one])
            assert outer.rv == 10 and keys(r) == ["d/a", "d/b", "d/c", "d/m"]  # nothing half-applied
        r._apply([lines[-1]])
        assert keys(r) == ["d/a", "d/m", "d/n"] and outer.rv == 15 and outer.cache.oldest_rv == 15
        assert r.diffs_taken == 1
        mine, _ = outer_client.take()
        assert b"".join(mine) == b"".join(frames)  # the same announcement, diff and bookmark

    asyncio.run(run())


def test_a_relist_diff_cut_short_by_the_end_of_the_stream_is_dropped():
    r = reflector()
    announce = {"watchcache.io/relist-diff-end": "15"}
    marker = {"kind": "Pod", "metadata": {"resourceVersion": "10", "annotations": announce}}
    r._apply([line("BOOKMARK", marker), line("DELETED", pod_json("a", 14))])
    assert keys(r) == ["d/a"] and r.cacher.rv == 10
    r.drop_diff()  # what _watch does when it starts again
    r._apply([line("ADDED", pod_json("b", 11))])  # a plain event after a reconnect applies at once
    assert keys(r) == ["d/a", "d/b"]


class RestartedApiserver:
    """kube-apiserver restarted while the reflector was away: its watch cache starts at rv 20, so a
    resume from 10 gets "too old resource version: 10 (20)"; a (b@15) was written before its start and
    not streamed; b@25 and b@30 after it. Keeps every LIST's params; ``exact`` False: refuses Exact LISTs."""

    def __init__(self, exact: bool = True) -> None:
        self.exact = exact
        self.lists: list[dict[str, str]] = []
        self.watch_rvs: list[str] = []

    async def get_json(self, path, params=None, timeout=30.0):  # type: ignore[no-untyped-def]
        params = dict(params or {})
        self.lists.append(params)
        if len(self.lists) == 1:
            return {"metadata": {"resourceVersion": "10"}, "items": [pod_json("a", 10)]}
        if params.get("resourceVersionMatch") == "Exact":
            if not self.exact:
                raise UpstreamError(410, "The resourceVersion for the provided list is too old.")
            assert params["resourceVersion"] == "20"
            return {"metadata": {"resourceVersion": "20"}, "items": [pod_json("a", 10), pod_json("b", 15)]}
        return {"metadata": {"resourceVersion": "30"}, "items": [pod_json("a", 10), pod_json("b", 30)]}

    async def watch_into(self, resource, params, on_lines, *, stall_timeout, **_options):  # type: ignore[no-untyped-def]
        self.watch_rvs.append(params["resourceVersion"])
        if params["resourceVersion"] == "10":
            message = "too old resource version: 10 (20)"
            raise UpstreamError(410, message, {"kind": "Status", "code": 410, "reason": "Expired", "message": message})
        if params["resourceVersion"] == "20":
            on_lines([line("MODIFIED", pod_json("b", 25)), line("MODIFIED", pod_json("b", 30))])
        await asyncio.sleep(3600)


def run_until_rv(client: RestartedApiserver, rv: int) -> Reflector:
    async def main() -> Reflector:
        cacher = Cacher(PODS)
        r = Reflector(client=client, cacher=cacher)  # type: ignore[arg-type]
        task = asyncio.ensure_future(r.run())
        try:
            await until(lambda: cacher.rv >= rv and r.relists == 1, 10.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return r

    return asyncio.run(main())


def test_after_a_restarted_apiservers_410_the_relist_is_at_the_rv_it_resumes_from():
    # Listing the newest state (b@30) would hand watchers b@30 as a diff: b@25 never seen.
    client = RestartedApiserver()
    r = run_until_rv(client, 30)
    assert client.lists[1] == {"limit": "500", "resourceVersion": "20", "resourceVersionMatch": "Exact"}
    assert client.watch_rvs == ["10", "20"]
    assert [(e.object.name, e.rv) for e in r.cacher.cache.events_since(20)] == [("b", 25), ("b", 30)]


def test_an_exact_relist_refused_falls_back_to_the_newest_state():
    client = RestartedApiserver(exact=False)
    r = run_until_rv(client, 30)
    assert [p.get("resourceVersion") for p in client.lists] == [None, "20", None]
    assert client.watch_rvs[:2] == ["10", "30"] and r.cacher.rv == 30

"""The upstream's flow control configuration: followed live, bad objects skipped and counted, defaults on 403/404."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from watchcache.fairness.classify import RequestDigest
from watchcache.fairness.controller import FlowControl
from watchcache.fairness.defaults import flow_schemas, priority_levels
from watchcache.fairness.metrics import FlowControlCollector
from watchcache.service.flowconfig import FlowConfigSource
from watchcache.upstream.client import UpstreamError

ALICE = RequestDigest("alice", ("system:authenticated",), "list", True, resource="pods", namespace="a")


class Upstream:
    def __init__(self) -> None:
        self.schemas = flow_schemas()
        self.levels = priority_levels()
        self.error: UpstreamError | None = None

    async def get_json(self, path: str) -> Any:
        if self.error is not None:
            raise self.error
        items = self.schemas if path.endswith("/flowschemas") else self.levels
        return {"kind": "List", "items": copy.deepcopy(items)}


def test_follows_the_upstream_skips_bad_objects_and_falls_back_to_defaults() -> None:
    up = Upstream()
    fc = FlowControl(8)
    source = FlowConfigSource(fc, up.get_json)
    asyncio.run(source.refresh())
    assert fc.source.startswith("the upstream's (11 FlowSchemas, 8 priority levels)")
    assert fc.classify(ALICE).flow_schema.name == "global-default"

    # An operator's schema for alice, at a higher precedence, and one nobody can follow.
    mine = copy.deepcopy(next(o for o in up.schemas if o["metadata"]["name"] == "global-default"))
    mine["metadata"] = {"name": "alice-first", "uid": "u-alice", "resourceVersion": "7"}
    mine["spec"]["matchingPrecedence"] = 50
    mine["spec"]["priorityLevelConfiguration"]["name"] = "workload-high"
    mine["spec"]["rules"][0]["subjects"] = [{"kind": "User", "user": {"name": "alice"}}]
    broken = {"metadata": {"name": "broken", "uid": "u-broken", "resourceVersion": "8"}, "spec": {"rules": 3}}
    up.schemas = [*up.schemas, mine, broken]
    up.levels = [*up.levels, {"metadata": {"name": "odd", "uid": "u-odd"}, "spec": {"type": "Sometimes"}}, "junk"]
    asyncio.run(source.refresh())
    asyncio.run(source.refresh())  # the same bad versions: counted once
    c = fc.classify(ALICE)
    assert (c.flow_schema.name, c.priority_level.name) == ("alice-first", "workload-high")
    assert fc.skipped == {"FlowSchema": 1, "PriorityLevelConfiguration": 2}
    text = generate_latest(_registry(fc)).decode()
    assert 'watchcache_flowcontrol_skipped_objects_total{kind="FlowSchema"} 1.0' in text
    assert 'apiserver_flowcontrol_nominal_limit_seats{priority_level="workload-high"} 2.0' in text

    up.error = UpstreamError(403, "forbidden")
    asyncio.run(source.refresh())
    assert "does not let the proxy's account list" in fc.source
    assert fc.classify(ALICE).flow_schema.name == "global-default"
    up.error = UpstreamError(404, "not found")
    asyncio.run(source.refresh())
    assert "does not serve" in fc.source
    up.error = UpstreamError(500, "boom")  # a failed poll keeps what is in force
    asyncio.run(source.refresh())
    assert "does not serve" in fc.source


def _registry(fc: FlowControl) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FlowControlCollector(lambda: fc))
    return registry


def test_metrics_under_kube_names_and_labels() -> None:
    fc = FlowControl(1)

    async def run() -> None:
        c = fc.classify(ALICE)
        held = await fc.admit(c, None)
        waiter = asyncio.create_task(fc.admit(c, None))
        await asyncio.sleep(0)
        text = generate_latest(_registry(fc)).decode()
        labels = 'flow_schema="global-default",priority_level="global-default"'
        assert f"apiserver_flowcontrol_current_inqueue_requests{{{labels}}} 1.0" in text
        assert f"apiserver_flowcontrol_current_executing_seats{{{labels}}} 1.0" in text
        held.release()
        (await waiter).release()
        text = generate_latest(_registry(fc)).decode()
        assert f"apiserver_flowcontrol_dispatched_requests_total{{{labels}}} 2.0" in text
        assert f'apiserver_flowcontrol_request_wait_duration_seconds_count{{execute="true",{labels}}} 2.0' in text
        assert f"apiserver_flowcontrol_current_executing_seats{{{labels}}} 0.0" in text
        estimated = 'flow_schema="global-default",le="1.0",priority_level="global-default"'
        assert f"apiserver_flowcontrol_work_estimated_seats_bucket{{{estimated}}} 2.0" in text
        # One seat of the worker's one per level (7 levels, each guaranteed one), 1 + 1 borrowable:
        # the guaranteed seats take all (kube's fair fraction is then 0).
        level = 'priority_level="global-default"'
        for name, value in (("nominal", 1), ("lower", 1), ("upper", 2), ("current", 1)):
            assert f"apiserver_flowcontrol_{name}_limit_seats{{{level}}} {value}.0" in text
        assert "apiserver_flowcontrol_seat_fair_frac 0.0" in text
        # A flow's pass-throughs at the upstream on its turns, and those waiting in its line (the proxy's own).
        first = await fc.admit(c, None)
        first.vacate()
        await first.upstream_turn(1.0)
        second = await fc.admit(c, None)
        second.vacate()
        line = asyncio.create_task(second.upstream_turn(1.0))
        await asyncio.sleep(0)
        text = generate_latest(_registry(fc)).decode()
        assert f"watchcache_flowcontrol_upstream_turns{{{labels}}} 1.0" in text
        assert f"watchcache_flowcontrol_upstream_line_requests{{{labels}}} 1.0" in text
        first.end_upstream_turn()
        await line
        second.end_upstream_turn()
        text = generate_latest(_registry(fc)).decode()
        assert f"watchcache_flowcontrol_upstream_turns{{{labels}}} 0.0" in text
        assert f"watchcache_flowcontrol_upstream_line_requests{{{labels}}} 0.0" in text

    asyncio.run(run())


def test_watched_changes_apply_live_and_410_relists() -> None:
    """List, then watch from the list's resourceVersion: an event applies at once, a bookmark moves the
    resume point, the end of a stream resumes from it, and 410 Gone (an ERROR event) relists."""
    up = Upstream()
    fc = FlowControl(8)
    calls: list[tuple[str, str]] = []
    lists: list[str] = []
    mine = copy.deepcopy(next(o for o in up.schemas if o["metadata"]["name"] == "global-default"))
    mine["metadata"] = {"name": "alice-first", "uid": "u-alice", "resourceVersion": "12"}
    mine["spec"]["matchingPrecedence"] = 50
    mine["spec"]["priorityLevelConfiguration"]["name"] = "workload-high"
    mine["spec"]["rules"][0]["subjects"] = [{"kind": "User", "user": {"name": "alice"}}]
    script: dict[str, list[list[dict[str, Any]]]] = {
        "flowschemas": [
            [
                {"type": "ADDED", "object": mine},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ],
            [{"type": "DELETED", "object": {**mine, "metadata": {**mine["metadata"], "resourceVersion": "16"}}}],
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}],
        ],
        "prioritylevelconfigurations": [],
    }
    seen: list[str] = []

    async def get_json(path: str) -> Any:
        lists.append(path.rsplit("/", 1)[1])
        listing = await up.get_json(path)
        listing["metadata"] = {"resourceVersion": "10"}
        return listing

    async def watch(plural: str, params: Any, on_lines: Any) -> None:
        calls.append((plural, params["resourceVersion"]))
        assert params["allowWatchBookmarks"] == "true"
        while "prioritylevelconfigurations" not in lists:  # applied once both kinds are listed
            await asyncio.sleep(0.001)
        if not script[plural]:
            await asyncio.Event().wait()  # a quiet stream
        events = script[plural].pop(0)
        on_lines([orjson.dumps(e) for e in events])
        seen.append(fc.classify(ALICE).flow_schema.name)

    async def run() -> None:
        source = FlowConfigSource(fc, get_json, watch, retry=(0.001, 0.001))
        task = asyncio.create_task(source.run())
        while len(lists) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 5))
    assert fc.source == "the upstream's (11 FlowSchemas, 8 priority levels), watched"
    # Added (alice's schema applies), deleted (back to global-default), then the ERROR relisted.
    assert seen == ["alice-first", "global-default"]
    assert calls[:3] == [("flowschemas", "10"), ("prioritylevelconfigurations", "10"), ("flowschemas", "15")] or (
        sorted(calls[:3])
        == sorted([("flowschemas", "10"), ("prioritylevelconfigurations", "10"), ("flowschemas", "15")])
    )
    assert sorted(lists) == ["flowschemas", "flowschemas", "prioritylevelconfigurations"]

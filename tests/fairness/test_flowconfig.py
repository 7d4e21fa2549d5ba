"""The upstream's flow control configuration: followed live, bad objects skipped and counted, defaults on 403/404."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

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

    asyncio.run(run())

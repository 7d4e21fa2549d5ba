"""The upstream's FlowSchemas and PriorityLevelConfigurations, followed by each worker's flow control.

A LIST of each kind every ``interval`` seconds with the proxy's own identity (a watch would
apply a change sooner; these objects change rarely, and a poll cannot lose its place). Where the
upstream does not serve ``flowcontrol.apiserver.k8s.io/v1`` (404) or the proxy's account may not
list it (403), kube's suggested configuration stays, and ``/readyz?verbose`` says why. An object
the proxy cannot follow is skipped, logged once per version and counted
(``watchcache_flowcontrol_skipped_objects_total``); the others apply. A failed poll keeps the
configuration in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from watchcache.fairness import defaults
from watchcache.fairness.config import FlowSchema, PriorityLevel, parse_flow_schema, parse_priority_level
from watchcache.fairness.controller import FlowControl
from watchcache.upstream.client import UpstreamError

__all__ = ["FlowConfigSource"]

log = logging.getLogger("watchcache.fairness")

_GROUP = "/apis/flowcontrol.apiserver.k8s.io/v1"
_KINDS = (("FlowSchema", "flowschemas"), ("PriorityLevelConfiguration", "prioritylevelconfigurations"))


class FlowConfigSource:
    """Polls the upstream for flow control's configuration and applies it to ``control``."""

    def __init__(self, control: FlowControl, get_json: Callable[[str], Awaitable[Any]], interval: float = 10.0) -> None:
        self.control = control
        self.get_json = get_json
        self.interval = interval
        self._reported: set[tuple[str, str, str]] = set()
        self._applied: tuple[tuple[FlowSchema, ...], tuple[PriorityLevel, ...]] | None = None

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def refresh(self) -> None:
        lists = []
        try:
            for _, plural in _KINDS:
                lists.append(await self.get_json(f"{_GROUP}/{plural}"))
        except UpstreamError as e:
            if e.code in (403, 404):
                why = "does not serve" if e.code == 404 else "does not let the proxy's account list"
                self._apply((), (), f"kube's suggested defaults: the upstream {why} {_GROUP} ({e.code})", fallback=True)
            else:
                log.warning("flow control: could not list %s (%s); the configuration in force stays", _GROUP, e)
            return
        except (OSError, TimeoutError, ValueError) as e:
            log.warning("flow control: could not list %s (%r); the configuration in force stays", _GROUP, e)
            return
        schemas = tuple(self._parsed(lists[0], "FlowSchema", parse_flow_schema))
        levels = tuple(self._parsed(lists[1], "PriorityLevelConfiguration", parse_priority_level))
        self._apply(schemas, levels, f"the upstream's ({len(schemas)} FlowSchemas, {len(levels)} priority levels)")

    def _apply(
        self, schemas: tuple[FlowSchema, ...], levels: tuple[PriorityLevel, ...], source: str, fallback: bool = False
    ) -> None:
        if fallback:
            schemas = tuple(parse_flow_schema(o) for o in defaults.flow_schemas())
            levels = tuple(parse_priority_level(o) for o in defaults.priority_levels())
        if (schemas, levels) == self._applied and source == self.control.source:
            return
        self._applied = (schemas, levels)
        self.control.configure(schemas, levels, source)
        log.info("flow control: configuration from %s", source)

    def _parsed(self, listing: Any, kind: str, parse: Callable[[Any], Any]) -> list[Any]:
        items = listing.get("items") if isinstance(listing, dict) else None
        out = []
        for obj in items if isinstance(items, list) else []:
            try:
                out.append(parse(obj))
            except ValueError as e:
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                meta = meta if isinstance(meta, dict) else {}
                key = (kind, str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
                if key not in self._reported:
                    self._reported.add(key)
                    self.control.skipped[kind] = self.control.skipped.get(kind, 0) + 1
                    log.warning("flow control: %s skipped: %s", kind, e)
        return out

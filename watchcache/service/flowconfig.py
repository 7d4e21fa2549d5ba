"""The upstream's FlowSchemas and PriorityLevelConfigurations, followed by each worker's flow control.

Each kind is listed, then watched from the list's resourceVersion with bookmarks, as a
reflector does (a small one: two kinds of a few dozen objects, not worth a cache): an event
applies the changed configuration at once; a watch the upstream ends is resumed from the last
resourceVersion seen; 410 Gone relists; any other failure retries with backoff, and the
configuration in force stays. Where the upstream does not serve
``flowcontrol.apiserver.k8s.io/v1`` (404) or the proxy's account may not list it (403), kube's
suggested configuration applies, ``/readyz?verbose`` says why, and the list is tried again a
minute later. An
object the proxy cannot follow is skipped, logged once per version and counted
(``watchcache_flowcontrol_skipped_objects_total``); the others apply.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from watchcache.backoff import Backoff
from watchcache.fairness import defaults
from watchcache.fairness.config import FlowSchema, PriorityLevel, parse_flow_schema, parse_priority_level
from watchcache.fairness.controller import FlowControl
from watchcache.upstream.client import UpstreamError, WatchStalled

__all__ = ["FlowConfigSource", "Watch"]

log = logging.getLogger("watchcache.fairness")

_GROUP = "/apis/flowcontrol.apiserver.k8s.io/v1"
_KINDS = (("FlowSchema", "flowschemas"), ("PriorityLevelConfiguration", "prioritylevelconfigurations"))

#: One watch stream of a kind (by its plural): each network read's event lines to the callback;
#: returns when the upstream ends it (``UpstreamClient.watch_into``).
Watch = Callable[[str, Mapping[str, str], Callable[[list[bytes]], None]], Awaitable[None]]


class FlowConfigSource:
    """Lists and watches the upstream's flow control configuration and applies it to ``control``."""

    def __init__(
        self,
        control: FlowControl,
        get_json: Callable[[str], Awaitable[Any]],
        watch: Watch | None = None,
        *,
        retry: tuple[float, float] = (1.0, 30.0),
        watch_timeout: float = 300.0,
        denied_retry: float = 60.0,
    ) -> None:
        self.control = control
        self.get_json = get_json
        self.watch = watch
        self.retry = retry
        self.watch_timeout = watch_timeout
        self.denied_retry = denied_retry
        self.objects: dict[str, dict[str, Any]] = {kind: {} for kind, _ in _KINDS}  # by name
        self.rv: dict[str, str | None] = dict.fromkeys(self.objects)
        self._listed: set[str] = set()  # kinds listed at least once
        self._denied: dict[str, str] = {}  # kind -> why the defaults apply
        self._reported: set[tuple[str, str, str]] = set()
        self._applied: tuple[tuple[FlowSchema, ...], tuple[PriorityLevel, ...]] | None = None

    async def run(self) -> None:
        """Follow both kinds until cancelled."""
        await asyncio.gather(*(self._follow(kind, plural) for kind, plural in _KINDS))

    async def refresh(self) -> None:
        """List both kinds once (a failure keeps what is in force)."""
        for kind, plural in _KINDS:
            try:
                await self._list(kind, plural)
            except UpstreamError as e:
                self._failed(kind, e)
            except (OSError, TimeoutError, ValueError) as e:
                log.warning("flow control: could not list %s (%r); the configuration in force stays", plural, e)

    async def _follow(self, kind: str, plural: str) -> None:
        backoff = Backoff(*self.retry)
        while True:
            try:
                if self.rv[kind] is None:
                    await self._list(kind, plural)
                assert self.watch is not None, "run() follows with a watch"
                timeout = int(self.watch_timeout * (1 + random.random()))
                params = {"resourceVersion": self.rv[kind] or "", "allowWatchBookmarks": "true"}
                await self.watch(plural, {**params, "timeoutSeconds": str(timeout)}, lambda ls: self._events(kind, ls))
                backoff.reset()  # ended by its timeout: resumed from the last resourceVersion
                continue
            except UpstreamError as e:
                if e.code == 410:  # too old: relist at once
                    log.info("flow control: the watch of %s is too old (410); listing again", plural)
                    self.rv[kind] = None
                    continue
                self._failed(kind, e)
                if e.code in (403, 404):  # not served, or not for the proxy: that rarely changes soon
                    await asyncio.sleep(self.denied_retry)
                    continue
            except (OSError, TimeoutError, ValueError, WatchStalled) as e:
                log.warning("flow control: following %s failed (%r); the configuration in force stays", plural, e)
            await asyncio.sleep(backoff.next())

    async def _list(self, kind: str, plural: str) -> None:
        listing = await self.get_json(f"{_GROUP}/{plural}")
        items = listing.get("items") if isinstance(listing, dict) else None
        meta = listing.get("metadata") if isinstance(listing, dict) else None
        objects: dict[str, Any] = {}
        for obj in items if isinstance(items, list) else []:
            objects[_name(obj) or str(len(objects))] = obj
        self.objects[kind] = objects
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self.rv[kind] = str(rv) if rv else None
        self._listed.add(kind)
        self._denied.pop(kind, None)
        self._configure()

    def _events(self, kind: str, lines: list[bytes]) -> None:
        """One read's watch events: applied, then the configuration recomputed once."""
        objects = self.objects[kind]
        for line in lines:
            event = orjson.loads(line)
            kind_of, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                raise ValueError(f"a watch event without an object: {line[:200]!r}")
            if kind_of == "ERROR":
                raise UpstreamError(int(obj.get("code") or 500), str(obj.get("message", "")), obj)
            meta = obj.get("metadata")
            rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
            if rv:
                self.rv[kind] = str(rv)
            if kind_of == "DELETED":
                objects.pop(_name(obj), None)
            elif kind_of in ("ADDED", "MODIFIED"):
                objects[_name(obj)] = obj
        self._configure()

    def _failed(self, kind: str, e: UpstreamError) -> None:
        if e.code in (403, 404):
            why = "does not serve" if e.code == 404 else "does not let the proxy's account list"
            self._denied[kind] = f"the upstream {why} {_GROUP} ({e.code})"
            self.rv[kind] = None
            self._listed.discard(kind)
            self._configure()
        else:
            log.warning("flow control: could not follow %s (%s); the configuration in force stays", kind, e)

    def _configure(self) -> None:
        if self._denied:
            self._apply(
                tuple(parse_flow_schema(o) for o in defaults.flow_schemas()),
                tuple(parse_priority_level(o) for o in defaults.priority_levels()),
                f"kube's suggested defaults: {next(iter(self._denied.values()))}",
            )
            return
        if len(self._listed) < len(_KINDS):
            return  # not both listed yet: what is in force stays
        schemas = tuple(self._parsed(self.objects["FlowSchema"].values(), "FlowSchema", parse_flow_schema))
        levels = tuple(
            self._parsed(
                self.objects["PriorityLevelConfiguration"].values(), "PriorityLevelConfiguration", parse_priority_level
            )
        )
        how = "watched" if self.watch is not None else "listed"
        self._apply(
            schemas, levels, f"the upstream's ({len(schemas)} FlowSchemas, {len(levels)} priority levels), {how}"
        )

    def _apply(self, schemas: tuple[FlowSchema, ...], levels: tuple[PriorityLevel, ...], source: str) -> None:
        if (schemas, levels) == self._applied and source == self.control.source:
            return
        self._applied = (schemas, levels)
        self.control.configure(schemas, levels, source)
        log.info("flow control: configuration from %s", source)

    def _parsed(self, items: Any, kind: str, parse: Callable[[Any], Any]) -> list[Any]:
        out = []
        for obj in items:
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


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""

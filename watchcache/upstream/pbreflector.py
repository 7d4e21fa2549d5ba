"""The reflector of a protobuf cache: the upstream's list+watch in protobuf, its bytes kept as they came.

Kube's own components read full objects in protobuf (client-go's typed clients send
``Accept: application/vnd.kubernetes.protobuf, */*``). The proxy serves them the upstream's
own bytes, so that they decode exactly what kube-apiserver would have sent: this reflector
lists and watches a resource with ``Accept: application/vnd.kubernetes.protobuf`` and hands
each object's message bytes, cut out of the list or watch frame, to its cache
(``cache/protobuf.py``: attributes read from the wire, the bytes never re-encoded). Everything
else is the JSON reflector's: resume, backoff, 410 → relist diff, stall detection, the
grouping of events that share an rv (``Reflector._apply``).

Two things only protobuf needs:

* an upstream that cannot write the kind in protobuf (the simulated cluster; kube for a custom
  resource) answers the list 406 or 415: ``NotServedInProtobuf`` ends the reflector, and the
  proxy answers such clients as before (``upstream/protobuf.py``);
* a bookmark is the kind's *empty* object, whose zero-valued spec and status only the schema
  knows: before the first sync the reflector learns it from a short watch's bookmark
  (``FullProtobuf.learn_empty``), so that its own bookmarks are byte for byte kube's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from watchcache.cache.encoding import PROTOBUF
from watchcache.cache.events import BOOKMARK, ERROR
from watchcache.cache.object import CachedObject, ObjectError, parse_resource_version
from watchcache.cache.protobuf import FULL_PROTOBUF, decode_protobuf_object
from watchcache.kubeproto import objects
from watchcache.resources import ResourceType
from watchcache.upstream.client import (
    Splitter,
    UpstreamClient,
    UpstreamError,
    WatchStalled,
    collection_path,
    status_from_protobuf,
)
from watchcache.upstream.reflector import Reflector

log = logging.getLogger("watchcache.upstream.pbreflector")

# The short watch that learns a kind's empty object: kube sends a watcher its bookmark 2 s before
# its timeout (cacher's nextBookmarkTime), so one of 4 s brings it within about 2 s.
TEMPLATE_WATCH_SECONDS = 4
# A label selector no object matches (a key that must exist and must not): a watch-list with it
# sends its initial-events-end bookmark and nothing before it.
NO_OBJECT = "watchcache.io/none,!watchcache.io/none"


class NotServedInProtobuf(Exception):
    """The upstream does not write this resource in protobuf (406/415 to a protobuf-only list)."""


class _Learned(Exception):
    """Raised from the template watch's callback to end it once a bookmark came."""


class ProtobufCodec:
    """A protobuf list page or watch event of a resource: each object's message bytes kept as they came
    (what the reflector and the upstream backfill, ``upstream/backfill.py``, read)."""

    accept = PROTOBUF
    split: Splitter = staticmethod(objects.split_frames)

    def __init__(self, resource: ResourceType) -> None:
        self.resource = resource

    def page(self, body: bytes) -> tuple[int, list[CachedObject], str | None]:
        """Raises ValueError (malformed), ObjectError (an item that cannot be cached)."""
        try:
            page = objects.list_page(objects.unknown(body).raw)
        except (objects.WireError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed protobuf list of {self.resource.qualified}: {e}") from None
        items: list[CachedObject] = [decode_protobuf_object(self.resource, raw) for raw in page.items]
        return parse_resource_version(page.resource_version), items, page.continue_token

    def event(self, line: bytes) -> tuple[str, CachedObject | None, dict[str, Any]]:
        """Raises ValueError (malformed), ObjectError (an object that cannot be cached)."""
        try:
            kind, body = objects.watch_event(line)
            raw = objects.unknown(body).raw
            if kind == ERROR:
                return kind, None, status_from_protobuf(raw)
            if kind == BOOKMARK:
                rv, annotations = objects.bookmark_meta(raw)
                FULL_PROTOBUF.learn_empty(self.resource, raw)
                return kind, None, {"resourceVersion": rv, "annotations": annotations}
        except UnicodeDecodeError as e:
            raise ValueError(f"malformed protobuf event: {e}") from None
        return kind, decode_protobuf_object(self.resource, raw), {}


class ProtobufReflector(Reflector):
    accept = PROTOBUF
    split: Splitter = staticmethod(objects.split_frames)

    async def _page(self, params: dict[str, str]) -> tuple[int, list[CachedObject], str | None]:
        try:
            body = await self.client.get_bytes(collection_path(self.resource), params, timeout=60.0, accept=PROTOBUF)
        except UpstreamError as e:
            if e.code in (406, 415):
                raise NotServedInProtobuf(f"{e.code}: {e.status.get('message') if e.status else e}") from None
            raise
        return ProtobufCodec(self.resource).page(body)

    async def _before_sync(self, rv: int, listed: list[CachedObject]) -> None:
        if FULL_PROTOBUF.knows_empty(self.resource):
            return
        if await self._learn_from_initial_events_end(rv):
            return
        if not listed:  # nothing to start the watch below before; the main watch's first bookmark teaches it
            return
        # An upstream without watch-list (before v1.27, or WatchList off): kube sends a bookmark only
        # once its cache is past the watch's start: start just before the newest listed object (its
        # event is replayed, and ignored here), and make kube's cache move.
        params = {
            "resourceVersion": str(max(obj.rv for obj in listed) - 1),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(TEMPLATE_WATCH_SECONDS),
        }
        watch = asyncio.ensure_future(self._template_watch(params, TEMPLATE_WATCH_SECONDS + 2.0))
        # A consistent read makes kube ask etcd for progress: its cache moves past the start even
        # on a resource nobody writes (docs/consistency.md), so the bookmark comes.
        await asyncio.sleep(0.2)
        with contextlib.suppress(UpstreamError, aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
            await self.client.list_rv(self.resource)
        try:
            await watch
        except _Learned:
            return
        except (UpstreamError, aiohttp.ClientError, WatchStalled, TimeoutError, OSError, ValueError) as e:
            log.warning("%s: no protobuf bookmark to learn the empty object from: %s", self.resource.qualified, e)
            return
        log.warning("%s: the upstream sent no bookmark in %ds", self.resource.qualified, TEMPLATE_WATCH_SECONDS)

    async def _learn_from_initial_events_end(self, rv: int) -> bool:
        return await learn_empty_object(self.client, self.resource, rv)

    async def _template_watch(self, params: dict[str, str], stall_timeout: float) -> None:
        await _template_watch(self.client, self.resource, params, stall_timeout)

    def _decode(self, line: bytes) -> tuple[str, CachedObject | None, object]:
        try:
            kind, body = objects.watch_event(line)
            raw = objects.unknown(body).raw
        except (objects.WireError, UnicodeDecodeError) as e:
            return "", None, e
        if kind == ERROR:
            try:
                return kind, None, status_from_protobuf(raw)
            except ValueError as e:
                return kind, None, {"code": 500, "message": f"malformed protobuf Status: {e}"}
        if kind == BOOKMARK:
            try:
                rv, annotations = objects.bookmark_meta(raw)
            except (objects.WireError, UnicodeDecodeError) as e:
                return "", None, e
            FULL_PROTOBUF.learn_empty(self.resource, raw)
            return kind, None, {"resourceVersion": rv, "annotations": annotations}
        try:
            return kind, decode_protobuf_object(self.resource, raw), None
        except ObjectError as e:
            return kind, None, e


async def learn_empty_object(client: UpstreamClient, resource: ResourceType, rv: int = 0) -> bool:
    """The empty object from a watch-list's initial-events-end bookmark, at once: a watch from ``rv``
    (0: the upstream's latest) with initial events and a label selector no object has, so kube sends
    its bookmark straight away (a plain watch's comes ~2 s before its timeout, and typed clients'
    first reads wait for this, ``upstream/protobuf.py``). False if the upstream does not do
    watch-lists (it refuses ``sendInitialEvents``, or sends no bookmark)."""
    params = {
        "resourceVersionMatch": "NotOlderThan",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "labelSelector": NO_OBJECT,
        "timeoutSeconds": str(TEMPLATE_WATCH_SECONDS),
    }
    if rv:
        params["resourceVersion"] = str(rv)
    try:
        await _template_watch(client, resource, params, TEMPLATE_WATCH_SECONDS + 2.0)
    except _Learned:
        return True
    except (UpstreamError, aiohttp.ClientError, WatchStalled, TimeoutError, OSError, ValueError) as e:
        log.info("%s: no watch-list bookmark to learn the empty object from (%s)", resource.qualified, e)
    return False


async def _template_watch(
    client: UpstreamClient, resource: ResourceType, params: dict[str, str], stall_timeout: float
) -> None:
    def learn(frames: list[bytes]) -> None:
        for frame in frames:
            kind, body = objects.watch_event(frame)
            if kind == BOOKMARK:
                FULL_PROTOBUF.learn_empty(resource, objects.unknown(body).raw)
                raise _Learned()

    await client.watch_into(
        resource, params, learn, stall_timeout=stall_timeout, accept=PROTOBUF, split=objects.split_frames
    )

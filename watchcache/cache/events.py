"""Watch events as the cache records them, and their wire frames, built once per event.

A frame is the exact bytes of one line of a watch response
(``{"type":"ADDED","object":{...}}\\n``). Every watcher that receives an event gets
the *same* bytes object: a frame is built the first time any watcher needs it and
cached on the event, so fan-out to N watchers costs one build, not N encodes.
"""

from __future__ import annotations

from typing import Final

from watchcache.cache.object import CachedObject
from watchcache.resources import ResourceType

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
BOOKMARK: Final = "BOOKMARK"
ERROR: Final = "ERROR"

EVENT_TYPES: Final = (ADDED, MODIFIED, DELETED)

_HEADS: Final = {t: b'{"type":"' + t.encode() + b'","object":' for t in (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR)}
_TAIL: Final = b"}\n"


def frame_head(event_type: str) -> bytes:
    return _HEADS[event_type]


def frame_tail() -> bytes:
    return _TAIL


class WatchEvent:
    """One change at one resourceVersion: ``object`` is the new state, ``prev`` the one before.

    ``type`` is normalised by the cache: ADDED iff there was no ``prev``, MODIFIED iff
    there was, DELETED for a removal (then ``object`` is the last state stamped with the
    deletion's resourceVersion, as kube's storage reports it).
    """

    __slots__ = ("_frames", "object", "prev", "received", "resource", "rv", "type")

    def __init__(
        self,
        resource: ResourceType,
        event_type: str,
        obj: CachedObject,
        prev: CachedObject | None,
        rv: int,
        received: float,
    ) -> None:
        self.resource = resource
        self.type = event_type
        self.object = obj
        self.prev = prev
        self.rv = rv
        self.received = received
        self._frames: dict[str, bytes] | None = None

    def __repr__(self) -> str:
        return f"WatchEvent({self.type}, {self.object.key!r}, rv={self.rv})"

    @property
    def size(self) -> int:
        return len(self.object.body)

    def frame(self, as_type: str) -> bytes:
        """The frame a watcher receives, which differs from ``type`` on selector transitions.

        ``as_type`` is ``type`` itself, ADDED for an object entering a watcher's selection
        (the new state), or DELETED for one leaving it: then, as kube's cacher does, the
        *previous* state stamped with the new state's resourceVersion.
        """
        frames = self._frames
        if frames is None:
            frames = self._frames = {}
        else:
            cached = frames.get(as_type)
            if cached is not None:
                return cached
        if as_type == DELETED and self.type == MODIFIED and self.prev is not None:
            # The new object's rv: the event's rv for an ordinary event, and inside a relist diff
            # (one group at rv R, objects carrying their own rvs) it keeps the stream's rvs increasing.
            source = self.prev.with_resource_version(self.object.rv)
        else:
            source = self.object
        built = b"".join((_HEADS[as_type], self.resource.typed_prefix, source.body, _TAIL))
        frames[as_type] = built
        return built


def bookmark_object(resource: ResourceType, rv: int, *, initial_events_end: bool = False) -> bytes:
    """The object of a BOOKMARK: only kind, apiVersion and metadata.resourceVersion (and the annotation)."""
    meta = b'"metadata":{"resourceVersion":"' + str(rv).encode() + b'"'
    if initial_events_end:
        meta += b',"annotations":{"k8s.io/initial-events-end":"true"}'
    return resource.typed_prefix + meta + b"}}"


def bookmark_frame(resource: ResourceType, rv: int, *, initial_events_end: bool = False) -> bytes:
    return _HEADS[BOOKMARK] + bookmark_object(resource, rv, initial_events_end=initial_events_end) + _TAIL


def error_frame(status_json: bytes) -> bytes:
    return _HEADS[ERROR] + status_json + _TAIL

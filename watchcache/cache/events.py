"""Watch events as the cache records them, and their wire frames, built once per event.

A frame is the exact bytes of one line of a watch response
(``{"type":"ADDED","object":{...}}\\n``). Every watcher that receives an event gets
the *same* bytes object: a frame is built the first time any watcher needs it and
cached on the event, so fan-out to N watchers costs one build, not N encodes
(invariant 5).

The JSON frame's layout is written here and nowhere else: ``json_frame`` and
``json_frame_ends`` build every JSON line, whatever the object in it (a full object, a
PartialObjectMetadata, a bookmark, a Status); ``cache/encoding.py`` chooses the object.
This module sits below the encodings: it knows them only as a ``FrameEncoder``.
"""

from __future__ import annotations

from typing import Final, Protocol

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


def json_frame(event_type: str, *object_parts: bytes) -> bytes:
    """One line of a JSON watch stream: ``{"type":"<event_type>","object":<object_parts joined>}\\n``."""
    return b"".join((_HEADS[event_type], *object_parts, _TAIL))


def json_frame_ends(event_type: str, object_head: bytes = b"", object_tail: bytes = b"") -> tuple[bytes, bytes]:
    """The bytes before and after an object's body in ``json_frame(event_type, object_head, body, object_tail)``.

    For frames written in pieces, the (shared, cached) body never copied: a watch's initial events.
    """
    return _HEADS[event_type] + object_head, object_tail + _TAIL


class FrameEncoder(Protocol):
    """An encoding other than full JSON, as ``WatchEvent.encoded`` uses it (``cache/encoding.py``, above this
    module: its shape, not its class, invariant 12)."""

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        """The frame of type ``as_type`` for object ``source``: called once per event, type and encoding."""
        ...


class WatchEvent:
    """One change at one resourceVersion: ``object`` is the new state, ``prev`` the one before.

    ``type`` is normalised by the cache: ADDED iff there was no ``prev``, MODIFIED iff
    there was, DELETED for a removal (then ``object`` is the last state stamped with the
    deletion's resourceVersion, as kube's storage reports it).
    """

    __slots__ = ("_frames", "_stamped", "object", "prev", "received", "resource", "rv", "type")

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
        # Frames by delivery type (full JSON), and by (encoding, delivery type) for the others.
        self._frames: dict[str | tuple[FrameEncoder, str], bytes] | None = None
        # The previous state stamped with this event's rv (a selector-leave DELETED), made once.
        self._stamped: CachedObject | None = None

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
        source = self._source(as_type) if as_type == DELETED else self.object
        built = json_frame(as_type, self.resource.typed_prefix, source.body)
        frames[as_type] = built
        return built

    def encoded(self, encoding: FrameEncoder, as_type: str) -> bytes:
        """``frame`` in another encoding (PartialObjectMetadata, protobuf): also built once."""
        frames = self._frames
        if frames is None:
            frames = self._frames = {}
        key = (encoding, as_type)
        cached = frames.get(key)
        if cached is None:
            cached = frames[key] = encoding.build_frame(self.resource, self._source(as_type), as_type)
        return cached

    def _source(self, as_type: str) -> CachedObject:
        if as_type == DELETED and self.type == MODIFIED and self.prev is not None:
            # The new object's rv: the event's rv for an ordinary event, and inside a relist diff
            # (one group at rv R, objects carrying their own rvs) it keeps the stream's rvs increasing.
            stamped = self._stamped
            if stamped is None:
                stamped = self._stamped = self.prev.with_resource_version(self.object.rv)
            return stamped
        return self.object

"""``meta.k8s.io`` Tables (kubectl's default output) written from cached objects.

One ``TableEncoding`` per (printer, Table version, ``includeObject``), shared by every request
and watcher that asks for it, so watchers of one Table form one group and share frames. A
body is written as other encodings write theirs, in pieces, nothing re-encoded:

- the envelope: ``{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{ListMeta}``, the
  column definitions (constant per printer), ``"rows":[``;
- per object, its ``Row`` (derived once, ``row.py``) with the ages written at the request's
  time (``clock``: ns since the epoch, read once per body or frame), then the row's object:
  ``null`` (None), the PartialObjectMetadata (Metadata, the default: its metadata derived once,
  ``cache/metadata.py``) or the object itself (Object).

Watch events are one-row Tables (``kubectl get -w``), built once per event and Table (as kube's
cacher caches one serialization per event and encoder: the ages are those of the first
encoding), with ``"columnDefinitions":null``; kube puts the columns in a watch's *first* event
only, which ``lead`` does for each watcher when its first frame is written. A bookmark is, as in
kube, the Table of an empty object carrying the rv. An object kube's printer would fail on
raises ``Unprintable`` for GET/LIST (the request is passed through); in a watch, the frame
carries the object itself, as kube's watch does when the conversion fails.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence

import orjson

from watchcache.cache.encoding import FULL_JSON, JSON, Encoding, bookmark_meta, bookmark_tail, json_list_meta
from watchcache.cache.events import ADDED, BOOKMARK, WatchEvent, json_frame
from watchcache.cache.metadata import metadata_json
from watchcache.cache.object import CachedObject
from watchcache.printers.duration import human_duration
from watchcache.printers.row import Printer, Unprintable, columns_json, row_of
from watchcache.resources import ResourceType

log = logging.getLogger("watchcache.printers")

INCLUDE_OBJECT = ("None", "Metadata", "Object")
# The head of a watch frame this module writes, up to the column definitions a watcher's first frame gets.
_HEADLESS = re.compile(
    rb'\{"type":"[A-Z]+","object":\{"kind":"Table","apiVersion":"meta\.k8s\.io/v1(?:beta1)?",'
    rb'"metadata":\{"resourceVersion":"[0-9]*"\},"columnDefinitions":null'
)


class TableEncoding(Encoding):
    """Tables of one printer, in one version of ``meta.k8s.io``, with one ``includeObject``."""

    content_type = JSON
    watch_content_type = JSON
    timeless = False  # ages are the request's: identical LISTs at one snapshot do not share a Table

    def __init__(self, printer: Printer, version: str, include: str, clock: Callable[[], int]) -> None:
        if include not in INCLUDE_OBJECT:
            raise ValueError(f"includeObject {include!r}")
        self.printer = printer
        self.version = version
        self.include = include
        self.clock = clock
        self.name = f"table-{version}-{include.lower()}"
        api_version = f"meta.k8s.io/{version}".encode()
        self.head = b'{"kind":"Table","apiVersion":"' + api_version + b'","metadata":'
        self.columns = columns_json(printer.columns)
        self.with_columns = b',"columnDefinitions":' + self.columns + b',"rows":['
        self.metadata_head = (
            b',"object":{"kind":"PartialObjectMetadata","apiVersion":"' + api_version + b'","metadata":'
        )
        self.lead = self._lead

    def __repr__(self) -> str:
        return f"TableEncoding({self.printer!r}, {self.name})"

    # ------------------------------------------------------------------------ rows

    def _rows(self, resource: ResourceType, items: Sequence[CachedObject], out: list[bytes]) -> None:
        # The hot loop of ``kubectl get``: per row, its cached pieces, an age per hole (memoized: objects
        # made in the same second share it) and the row's object; no parse, no encoding.
        printer = self.printer
        now = self.clock()
        memo: dict[int, bytes] = {}
        include = self.include
        if include == "Metadata":
            head, tail = self.metadata_head, b"}}"
        elif include == "Object":
            head, tail = b',"object":' + resource.typed_prefix, b"}"
        else:
            head, tail = b',"object":null}', b""
        append = out.append
        first = True
        for obj in items:
            if first:
                first = False
            else:
                append(b",")
            derived = obj.table_row
            row = derived[1] if derived is not None and derived[0] is printer else row_of(printer, obj, resource)
            pieces = row.pieces
            append(pieces[0])
            i = 1
            for at in row.stamps:
                age = memo.get(at)
                if age is None:
                    age = memo[at] = human_duration(now - at).encode()
                append(age)
                append(pieces[i])
                i += 1
            append(head)
            if include == "Metadata":
                append(metadata_json(obj, resource))
                append(tail)
            elif include == "Object":
                append(obj.body)
                append(tail)

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        out = [self.head + b'{"resourceVersion":"' + str(obj.rv).encode() + b'"}' + self.with_columns]
        self._rows(resource, (obj,), out)
        out.append(b"]}")
        return out

    def list_parts(
        self,
        resource: ResourceType,
        items: Sequence[CachedObject],
        rv: int,
        continue_token: str | None,
        remaining: int | None,
        *,
        shard_info: str | None = None,
    ) -> list[bytes]:
        # kube's Table copies resourceVersion, continue and remainingItemCount only: no shardInfo.
        out = [self.head + json_list_meta(rv, continue_token, remaining) + self.with_columns]
        if not items and self.printer.null_when_empty:
            out[0] = out[0][: -len(b"[")] + b"null}"
            return out
        self._rows(resource, items, out)
        out.append(b"]}")
        return out

    # ----------------------------------------------------------------------- watch

    def event_frame(self, event: WatchEvent, as_type: str) -> bytes:
        return event.encoded(self, as_type)

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        out = [self.head + b'{"resourceVersion":"' + str(source.rv).encode() + b'"},"columnDefinitions":null,"rows":[']
        try:
            self._rows(resource, (source,), out)
        except Unprintable as e:
            log.warning("no Table row for %s %s (%s): the watch event carries the object", resource.qualified,
                        source.key, e)  # fmt: skip
            return FULL_JSON.build_frame(resource, source, as_type)
        except Exception:
            # A bug in a printer: contained to this frame (raising would end every watcher of the resource).
            log.exception("printing %s %s failed: the watch event carries the object", resource.qualified, source.key)
            return FULL_JSON.build_frame(resource, source, as_type)
        out.append(b"]}")
        return json_frame(as_type, *out)

    def initial_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        return (self.build_frame(resource, obj, ADDED),)

    def initial_events(
        self, resource: ResourceType, objects: Iterable[CachedObject], matches: Callable[[CachedObject], bool]
    ) -> tuple[list[bytes], int]:
        """One one-row Table frame per matching object (its row derived once, its ages written now)."""
        build = self.build_frame
        frames = [build(resource, obj, ADDED) for obj in objects if matches(obj)]
        return frames, len(frames)

    def bookmark_frame(
        self, resource: ResourceType, rv: int, *, initial_events_end: bool = False, relist_diff_end: int | None = None
    ) -> bytes:
        # '"metadata":{...}'
        meta = bookmark_meta(rv, initial_events_end, relist_diff_end, unstructured=resource.custom)
        tail = bookmark_tail(resource)  # the kind's zero values: kube prints its empty object
        try:
            row = self.printer.row(orjson.loads(b"{" + meta + tail + b"}"))
        except Exception:  # Unprintable, or a printer's bug: a plain bookmark, as kube's failed conversion
            return FULL_JSON.bookmark_frame(
                resource, rv, initial_events_end=initial_events_end, relist_diff_end=relist_diff_end
            )
        out = [self.head + b'{"resourceVersion":"' + str(rv).encode() + b'"},"columnDefinitions":null,"rows":[']
        row.write(out, self.clock(), {})
        if self.include == "Object":
            out.append(b',"object":' + resource.typed_prefix + meta + tail + b"}}")
        elif self.include == "Metadata" or initial_events_end:
            # kube: the initial-events-end bookmark's row object is PartialObjectMetadata even for None;
            # typed, so its ObjectMeta in field order whatever the kind (a custom resource's too)
            typed = bookmark_meta(rv, initial_events_end, relist_diff_end) if resource.custom else meta
            out.append(self.metadata_head + typed[len(b'"metadata":') :] + b"}}")
        else:
            out.append(b',"object":null}')
        out.append(b"]}")
        return json_frame(BOOKMARK, *out)

    def _lead(self, frame: bytes) -> bytes:
        """A watcher's first frame: with the column definitions (kube omits them from later events)."""
        m = _HEADLESS.match(frame)
        if m is None:
            return frame
        return frame[: m.end() - 4] + self.columns + frame[m.end() :]

"""client-go's reflector, in Python: what an informer sends, in the order it sends it.

Written from client-go v1.36 (``tools/cache/reflector.go``, ``util/watchlist``, ``metadata/metadata.go``,
``rest/request.go``); a flavor is one kind of client:

- ``typed-protobuf``: a typed informer of a built-in kind (client-go's default for them since
  ``UseProtobufAsDefault``: ``Accept: application/vnd.kubernetes.protobuf,application/json``);
- ``typed-json``: a typed informer configured for JSON (``Accept: application/json``);
- ``metadata``: a metadata informer (the metadata client's exact Accept headers, protobuf first);
- ``metadata-json``: a metadata informer whose client asks for JSON only;
- ``watchlist``, ``watchlist-metadata``: the same with ``WatchListClient`` (on by default in 1.35+,
  so what kube-controller-manager v1.36 does): ``sendInitialEvents=true&resourceVersionMatch=
  NotOlderThan&allowWatchBookmarks=true``, synced at the ``k8s.io/initial-events-end`` bookmark,
  then the same stream goes on as the watch.

The reflector's rules, as client-go: LIST with ``resourceVersion=0&limit=500`` at start (the pager
follows ``continue`` tokens), then WATCH from the list's resourceVersion with bookmarks; a watch
that ends is resumed from the last resourceVersion seen (event or bookmark) without a list; a 410
(or a too-large resourceVersion) relists (from ``""``); a 429 (the watch's status or an ERROR
event) backs off and watches again from the same resourceVersion; a decode error or any other ERROR
event ends the watch with an error, and the reflector relists; a watch that ends within a second with no event is
"very short" and relists too. Every list, watch, 410 and decode error is counted. A decode error is
what client-go's decoder would refuse: an object of another kind than the informer's (typed:
``kind``/``apiVersion`` of each watch object, as the JSON decoder needs them; protobuf: the
``runtime.Unknown`` type), or bytes it cannot parse.

The store keeps each object's metadata as kube writes it in JSON (protobuf decoded to the same
shape by ``harness.metaclient``), so that a metadata informer's store can be compared whole with a
LIST's. The campaigns' recording informers are ``harness.fleet`` (why two: its docstring).
"""

from __future__ import annotations

import builtins
import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.metaclient import (
    META_JSON,
    META_LIST_JSON,
    META_LIST_PB,
    META_PB,
    PROTOBUF,
    Target,
    WatchReader,
    fetch,
    object_meta,
    query,
)
from watchcache.kubeproto import meta_pb2

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
TYPED_PROTOBUF = "application/vnd.kubernetes.protobuf,application/json"


@dataclass(frozen=True)
class Flavor:
    name: str
    list_accept: str
    watch_accept: str
    metadata: bool = False
    watch_list: bool = False


FLAVORS = {
    f.name: f
    for f in (
        Flavor("typed-protobuf", TYPED_PROTOBUF, TYPED_PROTOBUF),
        Flavor("typed-json", "application/json", "application/json"),
        Flavor("metadata", META_LIST_PB, META_PB, metadata=True),
        Flavor("metadata-json", META_LIST_JSON, META_JSON, metadata=True),
        Flavor("watchlist", TYPED_PROTOBUF, TYPED_PROTOBUF, watch_list=True),
        Flavor("watchlist-metadata", META_PB, META_PB, metadata=True, watch_list=True),
    )
}


# client-go's first backoff (reflector.go, defaultBackoffInit) before it watches again after a 429.
RETRY_AFTER_429 = 0.8


class DecodeError(Exception):
    pass


class Expired(Exception):
    pass


class TooManyRequests(Exception):
    """A 429 to a watch (its status, or an ERROR event): client-go backs off and watches again from its rv."""


@dataclass(repr=False)
class Informer:
    target: Target
    path: str  # the collection, e.g. /api/v1/namespaces/x/configmaps
    kind: str  # ConfigMap
    api_version: str  # v1
    flavor: Flavor
    watch_seconds: int = 5  # client-go uses 5-10 min; short here, so that watches are resumed often
    page: int = 500
    # key -> the object's metadata, as kube writes it in JSON (protobuf decoded to the same shape)
    store: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: str = ""
    rv_unavailable: bool = False
    synced: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lists: int = 0  # LISTs or watch-lists begun (the first one included)
    list_requests: int = 0  # LIST requests (pages)
    watches: int = 0
    expired: int = 0  # 410s and too-large resourceVersions
    retried: int = 0  # watches answered 429 and tried again from the same rv (no relist)
    decode_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    events: int = 0
    bookmarks: int = 0
    media: set[str] = field(default_factory=set)  # the content types the server answered in
    _stream: WatchReader | None = field(default=None, init=False, compare=False)  # read now; ``halt`` cuts it

    @property
    def expected(self) -> tuple[str, str]:
        return ("PartialObjectMetadata", "meta.k8s.io/v1") if self.flavor.metadata else (self.kind, self.api_version)

    def __repr__(self) -> str:
        counts = (
            f"lists={self.lists} list_requests={self.list_requests} watches={self.watches} expired={self.expired} "
            f"retried={self.retried} "
            f"decode_errors={len(self.decode_errors)} events={self.events} bookmarks={self.bookmarks}"
        )
        media = ",".join(sorted(m.removeprefix("application/") for m in self.media))
        return f"{self.flavor.name} {self.path} @ {self.target.url}: {counts} objects={len(self.store)} ({media})"

    # ---------------------------------------------------------------- the reflector's loop

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                stream = self.watch_list() if self.flavor.watch_list else None
                if stream is None and not self.flavor.watch_list:
                    self.list()
                self.synced.set()
                self.watch(stream)
            except Expired:
                self.expired += 1
                self.rv_unavailable = True
            except TooManyRequests:  # a watch-list's: client-go tries it again after its backoff
                self.retried += 1
                self.stop.wait(RETRY_AFTER_429)
            except DecodeError as e:
                if not self.stop.is_set():  # not a frame cut by ``halt``
                    self.decode_errors.append(str(e))
            except (OSError, ValueError, AssertionError, http.client.HTTPException) as e:
                if not self.stop.is_set():
                    self.errors.append(repr(e))
                    time.sleep(0.2)

    def halt(self) -> None:
        """Stop now: ``run`` returns without waiting for its watch to end (``watch_seconds``)."""
        self.stop.set()
        stream = self._stream
        if stream is not None:
            stream.interrupt()

    def wait_for(self, key: str, timeout: float) -> bool:
        """Until ``key`` (namespace/name) is in the store."""
        deadline = time.monotonic() + timeout
        while key not in self.store:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def versions(self) -> dict[str, tuple[str, str]]:
        """key -> (uid, resourceVersion) of every object in the store."""
        return {k: (m["uid"], m["resourceVersion"]) for k, m in self.store.items()}

    def relist_rv(self) -> str:
        if self.rv_unavailable:
            return ""
        return self.rv or "0"

    def list(self) -> None:
        """The pager: ``limit=500`` and the relist rv on the first page, ``continue`` after."""
        self.lists += 1
        rv = self.relist_rv()
        store: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            params = {"limit": self.page, "continue": token} if token else {"limit": self.page, "resourceVersion": rv}
            answer = fetch(self.target, query(self.path, **params), self.flavor.list_accept)
            self.list_requests += 1
            if answer.status in (410, 504):
                raise Expired(f"list: {answer.status}")
            assert answer.status == 200, (answer.status, answer.body[:300])
            self.media.add(answer.content_type)
            items, meta = self.decode_list(answer.content_type, answer.body)
            for m in items:
                store[_key(m)] = m
            token = meta.get("continue")
            if not token:
                self.store, self.rv, self.rv_unavailable = store, meta["resourceVersion"], False
                return

    def watch_list(self) -> WatchReader | None:
        """A watch with sendInitialEvents: ADDED events into a new store until the initial-events-end
        bookmark; then the store is replaced and the stream goes on as the watch."""
        self.lists += 1
        params: dict[str, Any] = {
            "allowWatchBookmarks": True, "resourceVersionMatch": "NotOlderThan", "sendInitialEvents": True,
            "timeoutSeconds": self.watch_seconds, "watch": True,
        }  # fmt: skip
        if not self.rv_unavailable and self.rv:
            params["resourceVersion"] = self.rv
        stream = self.open_watch(params)
        store: dict[str, dict[str, Any]] = {}
        try:
            while True:
                event = self.next_event(stream, 30.0)
                if event is None:
                    raise OSError("the watch-list ended before its initial-events-end bookmark")
                kind, meta = event
                if kind == "BOOKMARK":
                    self.bookmarks += 1
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        self.store, self.rv, self.rv_unavailable = store, meta["resourceVersion"], False
                        return stream
                    continue
                if kind != "ADDED":
                    raise DecodeError(f"watch-list: {kind} before the initial-events-end bookmark")
                store[_key(meta)] = meta
        except BaseException:
            stream.close()
            raise

    def open_watch(self, params: dict[str, Any]) -> WatchReader:
        self.watches += 1
        stream = WatchReader(self.target, query(self.path, **params), self.flavor.watch_accept, timeout=30)
        self._stream = stream
        if self.stop.is_set():  # halted while it was being opened
            stream.interrupt()
        if stream.status in (410, 504):
            stream.close()
            raise Expired(f"watch: {stream.status}")
        if stream.status == 429:
            stream.close()
            raise TooManyRequests("watch: 429")
        if stream.status != 200:
            body = stream.resp.read()[:300]
            stream.close()
            raise OSError(f"watch answered {stream.status}: {body!r}")
        self.media.add(stream.content_type)
        return stream

    def watch(self, stream: WatchReader | None) -> None:
        """Watches from ``rv`` until stopped; returns to relist (an Expired or DecodeError propagates)."""
        while not self.stop.is_set():
            try:
                if stream is None:
                    params = {"allowWatchBookmarks": True, "resourceVersion": self.rv,
                              "timeoutSeconds": self.watch_seconds, "watch": True}  # fmt: skip
                    stream = self.open_watch(params)
            except TooManyRequests:
                self.retried += 1
                self.stop.wait(RETRY_AFTER_429)
                continue
            started, count = time.monotonic(), 0
            try:
                while True:
                    event = self.next_event(stream, self.watch_seconds + 30.0)
                    if event is None:
                        break
                    count += 1
                    kind, meta = event
                    self.rv = meta["resourceVersion"]
                    if kind == "BOOKMARK":
                        self.bookmarks += 1
                        continue
                    self.events += 1
                    if kind == "DELETED":
                        self.store.pop(_key(meta), None)
                    else:
                        self.store[_key(meta)] = meta
            except TooManyRequests:
                self.retried += 1
                self.stop.wait(RETRY_AFTER_429)
                continue  # (the stream is closed below)
            finally:
                stream.close()
                stream = None
            if count == 0 and time.monotonic() - started < 1.0:
                raise OSError("very short watch")  # client-go relists after one

    # ---------------------------------------------------------------- decoding, as client-go's decoders

    def next_event(self, stream: WatchReader, timeout: float) -> tuple[str, dict[str, Any]] | None:
        raw = stream.raw(timeout)
        if raw is None:
            return None
        if stream.protobuf:
            kind, obj = self.decode_protobuf_event(raw)
        else:
            kind, obj = self.decode_json_event(raw)
        if kind == "ERROR":
            code = obj.get("code")
            if code in (410, 504):
                raise Expired(f"watch ERROR {code}")
            if code == 429:
                raise TooManyRequests(f"watch ERROR: {obj}")
            raise OSError(f"watch ERROR: {obj}")
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            raise DecodeError(f"unknown watch event type {kind!r}")
        return kind, obj

    def decode_json_event(self, raw: bytes) -> tuple[str, dict[str, Any]]:
        try:
            event = json.loads(raw)
            kind, obj = event["type"], event["object"]
        except (ValueError, KeyError, TypeError) as e:
            raise DecodeError(f"unable to decode watch event: {e!r}") from None
        if kind == "ERROR":
            return kind, obj
        got = (obj.get("kind"), obj.get("apiVersion"))
        if got != self.expected:
            raise DecodeError(f'unable to decode watch event: no kind "{got[0]}" is registered for {got[1]!r}')
        return kind, obj["metadata"]

    def decode_protobuf_event(self, raw: bytes) -> tuple[str, dict[str, Any]]:
        try:
            event = meta_pb2.WatchEvent.FromString(raw[4:])
            unknown = _unknown(event.object.raw)
        except Exception as e:
            raise DecodeError(f"unable to decode watch event: {e!r}") from None
        if event.type == "ERROR":
            status = meta_pb2.Status.FromString(unknown.raw)
            return "ERROR", {"code": status.code, "reason": status.reason, "message": status.message}
        got = (unknown.typeMeta.kind, unknown.typeMeta.apiVersion)
        if got != self.expected:
            raise DecodeError(f'unable to decode watch event: no kind "{got[0]}" is registered for {got[1]!r}')
        # Every kind's field 1 is its ObjectMeta: read as a PartialObjectMetadata, the rest is skipped.
        return event.type, object_meta(meta_pb2.PartialObjectMetadata.FromString(unknown.raw).metadata)

    def decode_list(self, content_type: str, body: bytes) -> tuple[builtins.list[dict[str, Any]], dict[str, Any]]:
        """(items' metadata, list metadata)."""
        kind, version = self.expected
        want = (kind + "List", version)
        try:
            if content_type.startswith(PROTOBUF):
                unknown = _unknown(body)
                got = (unknown.typeMeta.kind, unknown.typeMeta.apiVersion)
                lst = meta_pb2.PartialObjectMetadataList.FromString(unknown.raw)  # field 1 ListMeta, 2 items
                items = [object_meta(i.metadata) for i in lst.items]
                meta = {"resourceVersion": lst.metadata.resourceVersion, "continue": getattr(lst.metadata, "continue")}
            else:
                doc = json.loads(body)
                got = (doc.get("kind"), doc.get("apiVersion"))
                items = [i["metadata"] for i in doc["items"]]
                meta = doc["metadata"]
        except Exception as e:
            raise DecodeError(f"list: {e!r}") from None
        if got != want:
            raise DecodeError(f"list: {got} instead of {want}")
        return items, meta


def _unknown(body: bytes) -> meta_pb2.Unknown:
    if not body.startswith(b"k8s\x00"):
        raise ValueError(f"no protobuf magic: {body[:16]!r}")
    return meta_pb2.Unknown.FromString(body[4:])


def _key(meta: dict[str, Any]) -> str:
    return f"{meta.get('namespace') or ''}/{meta['name']}"

"""A client-go-style metadata client for the e2e tests, over raw HTTP(S), in JSON or protobuf.

``Target`` is a server (the proxy, or the reference kube-apiserver with TLS and a token);
``fetch`` sends one request with an exact Accept header; ``decode`` turns a JSON or
protobuf answer into kube's JSON shape (protobuf decoded with the runtime and our own
``meta.proto``, standing in for client-go's generated code); ``WatchReader`` reads one watch's
events. The reflector over them is ``harness.reflector``.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from watchcache.kubeproto import meta_pb2

PROTOBUF = "application/vnd.kubernetes.protobuf"
META_LIST_PB = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
META_PB = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)
META_LIST_JSON = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
META_JSON = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


@dataclass
class Target:
    url: str
    token: str | None = None
    ca_file: str | None = None

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cafile=self.ca_file)
            return http.client.HTTPSConnection(parts.hostname, parts.port, context=ctx, timeout=timeout)
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def headers(self, accept: str | None) -> dict[str, str]:
        out = {"User-Agent": "watchcache-e2e"}
        if accept is not None:
            out["Accept"] = accept
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes

    def decoded(self) -> Any:
        return decode(self.content_type, self.body)


def query(path: str, **params: Any) -> str:
    params = {k: ("true" if v is True else v) for k, v in params.items() if v is not None}
    return f"{path}?{urlencode(params)}" if params else path


def fetch(target: Target, path: str, accept: str | None, *, method: str = "GET", body: Any = None) -> Answer:
    conn = target.connect(10.0)
    try:
        headers = target.headers(accept)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, resp.getheader("Content-Type") or "", resp.read())
    finally:
        conn.close()


# ------------------------------------------------------------------ protobuf -> kube's JSON shape


def _time(t: meta_pb2.Time) -> str:
    return datetime.datetime.fromtimestamp(t.seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_meta(om: meta_pb2.ObjectMeta) -> dict[str, Any]:
    """ObjectMeta as kube writes it in JSON (empty fields omitted)."""
    out: dict[str, Any] = {}
    for name in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"):
        if getattr(om, name):
            out[name] = getattr(om, name)
    if om.generation:
        out["generation"] = om.generation
    if om.creationTimestamp.seconds:
        out["creationTimestamp"] = _time(om.creationTimestamp)
    if om.HasField("deletionTimestamp"):
        out["deletionTimestamp"] = _time(om.deletionTimestamp)
    if om.HasField("deletionGracePeriodSeconds"):
        out["deletionGracePeriodSeconds"] = om.deletionGracePeriodSeconds
    if om.labels:
        out["labels"] = dict(om.labels)
    if om.annotations:
        out["annotations"] = dict(om.annotations)
    if om.ownerReferences:
        refs = []
        for r in om.ownerReferences:
            ref: dict[str, Any] = {"apiVersion": r.apiVersion, "kind": r.kind, "name": r.name, "uid": r.uid}
            for flag in ("controller", "blockOwnerDeletion"):
                if r.HasField(flag):
                    ref[flag] = getattr(r, flag)
            refs.append(ref)
        out["ownerReferences"] = refs
    if om.finalizers:
        out["finalizers"] = list(om.finalizers)
    if om.managedFields:
        entries = []
        for e in om.managedFields:
            entry: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.apiVersion}
            if e.HasField("time"):
                entry["time"] = _time(e.time)
            entry["fieldsType"] = e.fieldsType
            if e.HasField("fieldsV1"):
                entry["fieldsV1"] = json.loads(e.fieldsV1.Raw)
            if e.subresource:
                entry["subresource"] = e.subresource
            entries.append(entry)
        out["managedFields"] = entries
    return out


def _list_meta(lm: meta_pb2.ListMeta) -> dict[str, Any]:
    out: dict[str, Any] = {"resourceVersion": lm.resourceVersion}
    if getattr(lm, "continue"):
        out["continue"] = getattr(lm, "continue")
    if lm.HasField("remainingItemCount"):
        out["remainingItemCount"] = lm.remainingItemCount
    return out


def decode_protobuf(body: bytes) -> dict[str, Any]:
    """A ``k8s\\0`` + Unknown body (PartialObjectMetadata(List) or Status) in kube's JSON shape."""
    if not body.startswith(b"k8s\x00"):
        raise ValueError(f"no protobuf magic: {body[:16]!r}")
    unknown = meta_pb2.Unknown.FromString(body[4:])
    kind, api_version = unknown.typeMeta.kind, unknown.typeMeta.apiVersion
    if kind == "PartialObjectMetadata":
        pom = meta_pb2.PartialObjectMetadata.FromString(unknown.raw)
        return {"kind": kind, "apiVersion": api_version, "metadata": object_meta(pom.metadata)}
    if kind == "PartialObjectMetadataList":
        lst = meta_pb2.PartialObjectMetadataList.FromString(unknown.raw)
        item_version = api_version
        return {
            "kind": kind,
            "apiVersion": api_version,
            "metadata": _list_meta(lst.metadata),
            "items": [
                {"kind": "PartialObjectMetadata", "apiVersion": item_version, "metadata": object_meta(i.metadata)}
                for i in lst.items
            ],
        }
    if kind == "Status":
        st = meta_pb2.Status.FromString(unknown.raw)
        out: dict[str, Any] = {"kind": "Status", "apiVersion": api_version, "metadata": {}, "status": st.status}
        out.update({"message": st.message, "reason": st.reason, "code": st.code})
        if st.HasField("details"):
            out["details"] = {k: v for k, v in (("name", st.details.name), ("kind", st.details.kind)) if v}
        return out
    raise ValueError(f"unexpected kind {api_version}/{kind}")


def decode(content_type: str, body: bytes) -> Any:
    if content_type.startswith(PROTOBUF):
        return decode_protobuf(body)
    return json.loads(body)


# ------------------------------------------------------------------ watch streams


class WatchReader:
    """A watch response read event by event, in JSON lines or length-prefixed protobuf frames."""

    def __init__(self, target: Target, path: str, accept: str | None, *, timeout: float = 10.0) -> None:
        self.conn = target.connect(timeout)
        self.conn.connect()
        self.sock: socket.socket = self.conn.sock
        self.conn.request("GET", path, headers=target.headers(accept))
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.content_type = self.resp.getheader("Content-Type") or ""
        self.protobuf = self.content_type.startswith(PROTOBUF)

    def raw(self, timeout: float) -> bytes | None:
        """The next frame's bytes (a JSON line or a protobuf WatchEvent), None at the end."""
        self.sock.settimeout(max(timeout, 0.01))
        if not self.protobuf:
            line = self.resp.readline()
            return line or None
        head = self.resp.read(4)
        if not head:
            return None
        if len(head) < 4:
            raise ValueError("truncated frame length")
        size = int.from_bytes(head, "big")
        frame = self.resp.read(size)
        if len(frame) < size:
            raise ValueError("truncated frame")
        return head + frame

    def next(self, timeout: float = 10.0) -> tuple[str, dict[str, Any]] | None:
        raw = self.raw(timeout)
        if raw is None:
            return None
        return decode_event(raw, self.protobuf)

    def close(self) -> None:
        self.resp.close()
        self.conn.close()
        self.sock.close()

    def interrupt(self) -> None:
        """End a read that another thread is waiting in (it sees the stream end): a client stopping."""
        # The socket's own shutdown, not SSLSocket's, which drops the TLS object under the reader.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def __enter__(self) -> WatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_event(raw: bytes, protobuf: bool) -> tuple[str, dict[str, Any]]:
    if not protobuf:
        event = json.loads(raw)
        return event["type"], event["object"]
    event = meta_pb2.WatchEvent.FromString(raw[4:])
    return event.type, decode_protobuf(event.object.raw)

"""A small Kubernetes API client for the load-side helper processes: many connections, one process.

A Python client per watch does not scale to thousands of kubelets; this one holds thousands of
TLS connections in one uvloop process, each a ``Protocol`` with no task of its own:

* ``H1Conn``: HTTP/1.1 keep-alive, one request at a time, parsed with httptools (chunked
  bodies decoded there, in C);
* ``H2Conn``: HTTP/2 with the ``h2`` library, many streams per connection (what client-go does
  against a server that offers ``h2``);
* both hand a response to a ``Sink`` (status, body bytes as they come, end), so a LIST, a WATCH
  and a PATCH are written once for either protocol;
* ``FrameSplitter`` cuts a watch body into events: JSON lines, or Kubernetes' protobuf watch
  framing (4-byte big-endian length, then the ``k8s\\0`` envelope);
* ``frame_type`` / ``frame_stamp`` / ``list_meta`` read what the benchmarks need from a frame or a
  LIST body (event type, the writer's ``bench/written-at`` stamp, resourceVersion and continue)
  without decoding objects: a few ``find`` calls, and a protobuf field walk of the first bytes.

It imports nothing of ``watchcache``: the benchmarks drive the real servers over HTTP, and the
same clients run against kube-apiserver.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
from collections.abc import Callable, Sequence
from urllib.parse import quote, urlsplit

import httptools

STAMP_KEY = "bench/written-at"
_STAMP = STAMP_KEY.encode()
PROTOBUF = "application/vnd.kubernetes.protobuf"
# What client-go asks for when a client is configured for protobuf (kubelets are, for core types).
ACCEPT_PROTOBUF = f"{PROTOBUF},application/json"
ACCEPT_JSON = "application/json"
_TYPES = (b"MODIFIED", b"ADDED", b"DELETED", b"BOOKMARK", b"ERROR")


# ---------------------------------------------------------------- targets


def add_target_flags(p: argparse.ArgumentParser, what: str = "https://host:port of the proxy or the apiserver") -> None:
    """The load-side helpers' ``--target``, ``--token`` and ``--ca``: ``Target(args.target, args.token, args.ca)``."""
    p.add_argument("--target", required=True, help=what)
    p.add_argument("--token", default="", help="bearer token (default: none)")
    p.add_argument("--ca", default="", help="CA file to verify the server (default: no verification)")


class Target:
    """Where the clients connect: ``https://host:port`` (or http), a bearer token, a TLS context."""

    def __init__(
        self, url: str, token: str = "", ca: str = "", *, h2: bool = False, cert: tuple[str, str] | None = None
    ) -> None:
        """``cert``: a client certificate and key to present (a node's identity); with it the context
        loads only ``ca``, not the system's trust store: thousands of kubelets have one each."""
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.token = token
        self.h2 = h2
        self.ssl: ssl.SSLContext | None = None
        if self.tls:
            if cert is not None:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                if ca:
                    ctx.load_verify_locations(cafile=ca)
                ctx.load_cert_chain(cert[0], cert[1])
            else:
                ctx = ssl.create_default_context(cafile=ca or None)
            if not ca:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"] if h2 else ["http/1.1"])
            self.ssl = ctx
        elif h2:
            raise ValueError("HTTP/2 needs TLS here (ALPN h2)")

    def headers(self, accept: str = ACCEPT_JSON) -> list[tuple[str, str]]:
        out = [("accept", accept), ("user-agent", "watchcache-bench/kubelet")]
        if self.token:
            out.append(("authorization", f"Bearer {self.token}"))
        return out

    async def connect(self, on_lost: Callable[[], None] | None = None) -> H1Conn | H2Conn:
        loop = asyncio.get_running_loop()
        factory: Callable[[], H1Conn | H2Conn] = (
            (lambda: H2Conn(self, on_lost)) if self.h2 else (lambda: H1Conn(self, on_lost))
        )
        _, proto = await loop.create_connection(factory, self.host, self.port, ssl=self.ssl)
        if isinstance(proto, H2Conn):
            await proto.ready
        return proto


def query(**params: str | int | bool | None) -> str:
    """``?a=b&c=d`` from keyword arguments (None left out, booleans as true/false)."""
    parts = []
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        parts.append(f"{k}={quote(str(v), safe='')}")
    return "?" + "&".join(parts) if parts else ""


# ---------------------------------------------------------------- responses


class Sink:
    """Receives one response. Subclasses override what they need."""

    status = 0
    content_type = ""
    retry_after = 0.0  # the response's Retry-After, set before on_status

    def on_status(self, status: int, content_type: str) -> None:
        self.status = status
        self.content_type = content_type

    def on_data(self, data: bytes) -> None:
        pass

    def on_end(self, error: str | None) -> None:
        """The response ended (``error``: why it ended early, e.g. the connection was lost)."""


class Collect(Sink):
    """A whole response, or its first ``keep`` bytes and the total size; ``done`` when it ends."""

    def __init__(self, keep: int = 1 << 62) -> None:
        self.keep = keep
        self.parts: list[bytes] = []
        self.kept = 0
        self.size = 0
        self.error: str | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_data(self, data: bytes) -> None:
        self.size += len(data)
        if self.kept < self.keep:
            self.parts.append(data)
            self.kept += len(data)

    def on_end(self, error: str | None) -> None:
        self.error = error
        if not self.done.done():
            self.done.set_result(None)

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)


# ---------------------------------------------------------------- HTTP/1.1


class H1Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are sent one after another (queued)."""

    __slots__ = ("_ctype", "_retry", "closed", "on_lost", "parser", "queue", "sink", "target", "transport")

    def __init__(self, target: Target, on_lost: Callable[[], None] | None = None) -> None:
        self.target = target
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.queue: list[tuple[bytes, Sink]] = []
        self.closed = False
        self._ctype = b""
        self._retry = b""

    # -- API
    def request(
        self,
        method: str,
        path: str,
        sink: Sink,
        *,
        accept: str = ACCEPT_JSON,
        body: bytes = b"",
        content_type: str = "",
    ) -> None:
        head = [f"{method} {path} HTTP/1.1", f"host: {self.target.host}:{self.target.port}"]
        head += [f"{k}: {v}" for k, v in self.target.headers(accept)]
        if body or method in ("PATCH", "POST", "PUT"):
            head.append(f"content-length: {len(body)}")
            if content_type:
                head.append(f"content-type: {content_type}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        if self.closed:
            sink.on_end("connection closed")
            return
        if self.sink is None:
            self.sink = sink
            assert self.transport is not None
            self.transport.write(data)
        else:
            self.queue.append((data, sink))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass
        except httptools.HttpParserError as e:
            self._fail(f"bad response: {e}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail("connection lost")
        if self.on_lost is not None:
            self.on_lost()

    def _fail(self, why: str) -> None:
        sink, self.sink = self.sink, None
        queue, self.queue = self.queue, []
        if sink is not None:
            sink.on_end(why)
        for _, s in queue:
            s.on_end(why)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self._ctype = value
        elif lower == b"retry-after":
            self._retry = value

    def on_headers_complete(self) -> None:
        if self.sink is not None:
            if self._retry:
                with contextlib.suppress(ValueError):
                    self.sink.retry_after = float(self._retry)
            self.sink.on_status(self.parser.get_status_code(), self._ctype.decode("latin-1"))
        self._ctype = self._retry = b""

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_data(body)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.on_end(None)
        if self.queue and not self.closed:
            data, self.sink = self.queue.pop(0)
            assert self.transport is not None
            self.transport.write(data)


# ---------------------------------------------------------------- HTTP/2


class H2Conn(asyncio.Protocol):
    """One HTTP/2 connection (``h2``), a stream per request; windows opened wide once."""

    WINDOW = 1 << 30

    def __init__(self, target: Target, on_lost: Callable[[], None] | None = None) -> None:
        import h2.config
        import h2.connection
        import h2.settings

        self.target = target
        self.on_lost = on_lost
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        sc = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={sc.INITIAL_WINDOW_SIZE: self.WINDOW, sc.ENABLE_PUSH: 0}
        )
        self.transport: asyncio.Transport | None = None
        self.sinks: dict[int, Sink] = {}
        self.waiting: list[tuple[list[tuple[bytes, bytes]], bytes, Sink]] = []
        self.closed = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def request(
        self,
        method: str,
        path: str,
        sink: Sink,
        *,
        accept: str = ACCEPT_JSON,
        body: bytes = b"",
        content_type: str = "",
    ) -> None:
        headers = [
            (b":method", method.encode()),
            (b":path", path.encode()),
            (b":scheme", b"https"),
            (b":authority", f"{self.target.host}:{self.target.port}".encode()),
        ]
        headers += [(k.encode(), v.encode()) for k, v in self.target.headers(accept)]
        if content_type:
            headers.append((b"content-type", content_type.encode()))
        if self.closed:
            sink.on_end("connection closed")
            return
        if self.conn.open_outbound_streams >= self.conn.remote_settings.max_concurrent_streams:
            self.waiting.append((headers, body, sink))
            return
        self._start(headers, body, sink)

    def _start(self, headers: list[tuple[bytes, bytes]], body: bytes, sink: Sink) -> None:
        sid = self.conn.get_next_available_stream_id()
        self.sinks[sid] = sink
        self.conn.send_headers(sid, headers, end_stream=not body)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        self._flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        ssl_obj = transport.get_extra_info("ssl_object")
        if ssl_obj is not None and ssl_obj.selected_alpn_protocol() != "h2":
            self.ready.set_exception(RuntimeError("the server did not agree to HTTP/2 (ALPN)"))
            self.close()
            return
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(self.WINDOW)
        self._flush()

    def data_received(self, data: bytes) -> None:
        import h2.events
        import h2.exceptions

        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._fail(f"h2 protocol error: {e}")
            self.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                sink = self.sinks.get(ev.stream_id)
                if ev.flow_controlled_length:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if sink is not None:
                    sink.on_data(ev.data)
            elif isinstance(ev, h2.events.ResponseReceived):
                sink = self.sinks.get(ev.stream_id)
                if sink is not None:
                    hdrs = dict(ev.headers)
                    with contextlib.suppress(ValueError):
                        sink.retry_after = float(hdrs.get(b"retry-after", b"0"))
                    sink.on_status(int(hdrs.get(b":status", b"0")), hdrs.get(b"content-type", b"").decode())
            elif isinstance(ev, h2.events.StreamEnded):
                self._end(ev.stream_id, None)
            elif isinstance(ev, h2.events.StreamReset):
                self._end(ev.stream_id, f"stream reset ({ev.error_code})")
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                if not self.ready.done():
                    self.ready.set_result(None)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self._fail(f"GOAWAY ({ev.error_code})")
        self._flush()

    def _end(self, sid: int, error: str | None) -> None:
        sink = self.sinks.pop(sid, None)
        if sink is not None:
            sink.on_end(error)
        while self.waiting and self.conn.open_outbound_streams < self.conn.remote_settings.max_concurrent_streams:
            self._start(*self.waiting.pop(0))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("connection lost before SETTINGS"))
        self._fail("connection lost")
        if self.on_lost is not None:
            self.on_lost()

    def _fail(self, why: str) -> None:
        sinks, self.sinks = self.sinks, {}
        waiting, self.waiting = self.waiting, []
        for s in sinks.values():
            s.on_end(why)
        for _, _, s in waiting:
            s.on_end(why)


Conn = H1Conn | H2Conn


# ---------------------------------------------------------------- watch frames


class FrameSplitter:
    """Cuts a watch body into events: JSON lines, or protobuf length-prefixed frames."""

    __slots__ = ("buf", "protobuf")

    def __init__(self, protobuf: bool) -> None:
        self.protobuf = protobuf
        self.buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        if self.protobuf:
            i, n = 0, len(buf)
            while n - i >= 4:
                size = int.from_bytes(buf[i : i + 4], "big")
                if n - i - 4 < size:
                    break
                out.append(buf[i + 4 : i + 4 + size])
                i += 4 + size
            self.buf = buf[i:]
            return out
        start = 0
        end = buf.find(b"\n")
        while end != -1:
            if end > start:
                out.append(buf[start:end])
            start = end + 1
            end = buf.find(b"\n", start)
        self.buf = buf[start:]
        return out


def frame_type(frame: bytes) -> str:
    """ADDED, MODIFIED, DELETED, BOOKMARK or ERROR: found in the first bytes (JSON and protobuf alike)."""
    head = frame[:48]
    for t in _TYPES:
        if t in head:
            return t.decode()
    return "?"


def frame_stamp(frame: bytes) -> str | None:
    """The ``bench/written-at`` annotation's value, as written (a JSON string or a protobuf map entry)."""
    i = frame.find(_STAMP)
    if i < 0:
        return None
    j = i + len(_STAMP)
    if frame[j : j + 3] == b'":"':
        end = frame.find(b'"', j + 3)
        return frame[j + 3 : end].decode() if end > 0 else None
    if frame[j : j + 1] == b"\x12":  # protobuf: the map entry's value field, a short string
        n = frame[j + 1]
        return frame[j + 2 : j + 2 + n].decode()
    return None


_RV = b'"resourceVersion":"'


def json_event_rv(frame: bytes) -> str:
    """The event's object's resourceVersion (the first in the line: the object's metadata comes first)."""
    i = frame.find(_RV)
    if i < 0:
        return ""
    i += len(_RV)
    return frame[i : frame.find(b'"', i)].decode()


def _unwrap(buf: bytes, span: tuple[int, int]) -> tuple[int, int] | None:
    """The ``raw`` of a ``k8s\\0`` envelope (runtime.Unknown) at ``span``; the span itself if none."""
    s, e = span
    if buf[s : s + 4] == b"k8s\x00":
        return _pb_field(buf, 2, s + 4, e)
    return span


def pb_event_rv(frame: bytes) -> str:
    """The resourceVersion of a protobuf watch event's object: WatchEvent.object.raw → metadata (1) → rv (6)."""
    try:
        event = _unwrap(frame, (0, len(frame)))
        obj = event and _pb_field(frame, 2, *event)  # WatchEvent.object (RawExtension)
        raw = obj and _pb_field(frame, 1, *obj)  # RawExtension.raw
        inner = raw and _unwrap(frame, raw)
        meta = inner and _pb_field(frame, 1, *inner)  # ObjectMeta
        rv = meta and _pb_field(frame, 6, *meta)
    except IndexError:
        return ""
    return frame[rv[0] : rv[1]].decode() if rv else ""


# ---------------------------------------------------------------- LIST metadata


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf):
            raise IndexError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _pb_field(buf: bytes, number: int, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """(start, end) of the first length-delimited field ``number`` in buf[start:end], else None.

    Tolerates a truncated tail (a LIST body of which only the first bytes were kept): a field
    that starts but does not end in ``buf`` is returned clipped.
    """
    end = len(buf) if end is None else min(end, len(buf))
    i = start
    while i < end:
        key, i = _varint(buf, i)
        fnum, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            if fnum == number:
                return i, min(i + size, end)
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return None
    return None


def list_meta(body: bytes, content_type: str) -> tuple[str, str]:
    """(resourceVersion, continue) of a LIST response, from its first bytes (JSON or protobuf)."""
    if content_type.startswith(PROTOBUF):
        if not body.startswith(b"k8s\x00"):
            return "", ""
        buf = body[4:]
        raw = _pb_field(buf, 2)  # runtime.Unknown.raw: the PodList
        if raw is None:
            return "", ""
        meta = _pb_field(buf, 1, *raw)  # List.metadata: ListMeta
        if meta is None:
            return "", ""
        rv_span = _pb_field(buf, 2, *meta)
        cont_span = _pb_field(buf, 3, *meta)
        return (
            buf[rv_span[0] : rv_span[1]].decode() if rv_span else "",
            buf[cont_span[0] : cont_span[1]].decode() if cont_span else "",
        )
    # JSON: ListMeta comes before the items in kube's encoding and in watchcache's.
    head = body[: body.find(b'"items"')] if b'"items"' in body[:4096] else body[:4096]
    rv = _json_string(head, b'"resourceVersion":')
    cont = _json_string(head, b'"continue":')
    return rv, cont


def _json_string(head: bytes, key: bytes) -> str:
    i = head.find(key)
    if i < 0:
        return ""
    i = head.find(b'"', i + len(key))
    j = head.find(b'"', i + 1)
    return head[i + 1 : j].decode() if i >= 0 and j > i else ""


async def close_all(conns: Sequence[Conn]) -> None:
    for c in conns:
        with contextlib.suppress(Exception):
            c.close()
    await asyncio.sleep(0)

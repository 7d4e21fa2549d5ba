"""Client ends of connection upgrades for the tests: a raw upgrade (SPDY-style byte stream) and a
WebSocket client on wsproto, both on plain sockets so that the tests control every byte."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    TextMessage,
)
from wsproto.events import Request as WsRequest


@dataclass
class Head:
    status: int
    headers: dict[str, str]
    raw: bytes


def connect(url: str, timeout: float = 10.0, context: ssl.SSLContext | None = None) -> socket.socket:
    u = urlsplit(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    if u.scheme == "https":
        assert context is not None
        sock = context.wrap_socket(sock, server_hostname=u.hostname)
    return sock


def read_head(sock: socket.socket, buffered: bytearray) -> Head:
    """Read one response head; bytes after it stay in ``buffered``."""
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"closed before a response head: {bytes(buffered)!r}")
        buffered += data
    end = buffered.index(b"\r\n\r\n") + 4
    raw = bytes(buffered[:end])
    del buffered[:end]
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Head(status, headers, raw)


def read_body(sock: socket.socket, head: Head, buffered: bytearray) -> bytes:
    """The body of a non-101 answer (Content-Length or chunked)."""
    if "content-length" in head.headers:
        size = int(head.headers["content-length"])
        while len(buffered) < size:
            buffered += sock.recv(65536)
        return bytes(buffered[:size])
    body = b""
    while True:
        while b"\r\n" not in buffered:
            buffered += sock.recv(65536)
        line_end = buffered.index(b"\r\n")
        size = int(buffered[:line_end], 16)
        while len(buffered) < line_end + 2 + size + 2:
            buffered += sock.recv(65536)
        body += bytes(buffered[line_end + 2 : line_end + 2 + size])
        del buffered[: line_end + 2 + size + 2]
        if size == 0:
            return body


@dataclass
class Upgraded:
    """A raw upgrade: the response head, then the socket as a byte stream."""

    sock: socket.socket
    head: Head
    buffered: bytearray = field(default_factory=bytearray)

    def recv_exactly(self, n: int, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.buffered) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {len(self.buffered)} of {n} bytes")
            self.buffered += data
        out = bytes(self.buffered[:n])
        del self.buffered[:n]
        return out

    def recv_until_closed(self, timeout: float = 10.0) -> bytes:
        self.sock.settimeout(timeout)
        out = bytes(self.buffered)
        self.buffered.clear()
        try:
            while data := self.sock.recv(65536):
                out += data
        except ConnectionResetError:
            pass
        return out

    def body(self) -> bytes:
        return read_body(self.sock, self.head, self.buffered)

    def json(self) -> Any:
        return json.loads(self.body())

    def close(self) -> None:
        self.sock.close()


def raw_upgrade(
    url: str,
    path: str,
    protocol: str = "SPDY/3.1",
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    early: bytes = b"",
    context: ssl.SSLContext | None = None,
) -> Upgraded:
    """Send an upgrade request (plus ``early`` bytes in the same write) and read the answer's head."""
    sock = connect(url, context=context)
    host = urlsplit(url).netloc
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: Upgrade", f"Upgrade: {protocol}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    sock.sendall(("\r\n".join([*lines, "", ""])).encode("latin-1") + early)
    buffered = bytearray()
    head = read_head(sock, buffered)
    return Upgraded(sock, head, buffered)


class WebSocket:
    """A blocking WebSocket client on wsproto (the handshake and framing are the library's)."""

    def __init__(
        self,
        url: str,
        path: str,
        *,
        subprotocols: list[str] | None = None,
        headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.sock = connect(url, timeout, context)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.messages: list[bytes | str] = []
        self._partial: dict[str, Any] = {}  # a message arriving in fragments, by kind
        self.closed: CloseConnection | None = None
        self.rejected: tuple[int, dict[str, str], bytes] | None = None
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        host = urlsplit(url).netloc
        self.sock.sendall(
            self.ws.send(WsRequest(host=host, target=path, subprotocols=subprotocols or [], extra_headers=extra))
        )
        self.subprotocol: str | None = None
        self.accepted = False
        self._refused = False  # a refusal's whole body has arrived
        while not self.accepted and not self._refused:
            self._pump(timeout)

    def _pump(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        self.ws.receive_data(data or None)
        partial = self._partial
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.accepted = True
                self.subprotocol = event.subprotocol
            elif isinstance(event, RejectConnection):
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                self.rejected = (event.status_code, headers, b"")
                self._refused = not event.has_body
            elif isinstance(event, RejectData):
                assert self.rejected is not None
                self.rejected = (self.rejected[0], self.rejected[1], self.rejected[2] + event.data)
                self._refused = event.body_finished
            elif isinstance(event, Message):
                key = "b" if isinstance(event, BytesMessage) else "t"
                partial[key] = partial.get(key, b"" if key == "b" else "") + event.data
                if event.message_finished:
                    self.messages.append(partial.pop(key))
            elif isinstance(event, Ping):
                self.sock.sendall(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = event
                with contextlib.suppress(OSError):
                    self.sock.sendall(self.ws.send(event.response()))
        if not data and self.closed is None:
            self.closed = CloseConnection(code=1006)

    def send(self, data: bytes | str) -> None:
        kind = BytesMessage if isinstance(data, bytes) else TextMessage
        self.sock.sendall(self.ws.send(kind(data=data)))  # type: ignore[arg-type]

    def receive(self, timeout: float = 10.0) -> bytes | str | None:
        """The next whole message; None once the connection has closed."""
        deadline = time.monotonic() + timeout
        while not self.messages:
            if self.closed is not None:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message")
            self._pump(remaining)
        return self.messages.pop(0)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the peer may be gone, or the state already closed
            if self.closed is None:
                self.sock.sendall(self.ws.send(CloseConnection(code=1000)))
        self.sock.close()

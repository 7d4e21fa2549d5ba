"""A small fake upstream for connection upgrades, on a real socket in a background thread.

Paths (any method):

- ``/ws/echo``: ``Upgrade: websocket`` answered by wsproto (the subprotocol the client offers
  first is chosen); every message is echoed back.
- ``/spdy/echo``: ``Upgrade: SPDY/3.1`` answered with a raw 101, then every byte is echoed;
  ``?greet=1`` sends ``HELLO`` in the same write as the head; on EOF it writes ``EOF:<bytes
  received>`` and closes.
- ``/spdy/flood?bytes=N``: a raw 101, then N bytes as fast as the connection takes them.
- ``/spdy/sink``: a raw 101, then reads nothing (for the client -> upstream direction).
- ``/forbidden``: 403 with a kube Status, as kube-apiserver refuses an exec.
- ``/not-modified``: a 304 without Content-Type (kube's to a revalidated discovery GET).
- ``/slow-head``: never answers.
- anything else: 404 Status (the proxy's discovery sees an upstream that serves nothing).

Every request head is recorded in ``heads`` (method, target, header lines).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Message, Ping, TextMessage
from wsproto.events import Request as WsRequest
from wsproto.utilities import RemoteProtocolError

SPDY_101 = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"


def status_body(code: int, reason: str, message: str) -> bytes:
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
           "reason": reason, "code": code}  # fmt: skip
    return json.dumps(doc).encode()


def plain(code: int, phrase: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\nAudit-Id: fake\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Head:
    method: str
    target: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass
class FakeUpstream:
    heads: list[Head] = field(default_factory=list)
    flood_written: int = 0
    sink_connections: int = 0
    echoed: int = 0
    # Where to listen: loopback, or an address kube-apiserver may proxy to (not loopback).
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-upstream", daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, self.host, 0)

    def stop(self) -> None:
        if not self.thread.is_alive():
            return

        async def close() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def upgrade_heads(self) -> list[Head]:
        return [h for h in self.heads if h.get("upgrade")]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = raw.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
        head = Head(method, target, headers)
        self.heads.append(head)
        url = urlsplit(target)
        query = parse_qs(url.query)
        try:
            await self._route(url.path, query, head, raw, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _route(
        self,
        path: str,
        query: dict[str, list[str]],
        head: Head,
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        upgrade = (head.get("upgrade") or "").lower()
        if path == "/forbidden":
            message = 'pods "p" is forbidden: User "nobody" cannot create resource "pods/exec"'
            writer.write(plain(403, "Forbidden", status_body(403, "Forbidden", message)))
        elif path == "/not-modified":
            writer.write(b'HTTP/1.1 304 Not Modified\r\nEtag: "x"\r\nCache-Control: public\r\n\r\n')
        elif path == "/slow-head":
            await asyncio.sleep(3600)
        elif path == "/ws/echo" and upgrade == "websocket":
            await self._websocket_echo(raw, reader, writer)
        elif path == "/spdy/echo" and upgrade == "spdy/3.1":
            writer.write(SPDY_101 + (b"HELLO" if query.get("greet") else b""))
            received = 0
            while data := await reader.read(65536):
                received += len(data)
                self.echoed += len(data)
                writer.write(data)
                await writer.drain()
            writer.write(b"EOF:%d" % received)
            await writer.drain()
        elif path == "/spdy/flood" and upgrade == "spdy/3.1":
            writer.write(SPDY_101)
            remaining = int(query["bytes"][0])
            block = bytes(range(256)) * 256  # 64 KiB
            while remaining > 0:
                part = block[: min(len(block), remaining)]
                writer.write(part)
                await writer.drain()
                remaining -= len(part)
                self.flood_written += len(part)
        elif path == "/spdy/sink" and upgrade == "spdy/3.1":
            writer.write(SPDY_101)
            self.sink_connections += 1
            await asyncio.sleep(3600)
        else:
            writer.write(plain(404, "Not Found", status_body(404, "NotFound", "the server could not find it")))
        await writer.drain()

    async def _websocket_echo(self, raw: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        try:
            ws.receive_data(raw)
        except RemoteProtocolError as e:
            writer.write(plain(400, "Bad Request", status_body(400, "BadRequest", str(e))))
            return
        for event in ws.events():
            if isinstance(event, WsRequest):
                chosen = event.subprotocols[0] if event.subprotocols else None
                writer.write(ws.send(AcceptConnection(subprotocol=chosen)))
        while data := await reader.read(65536):
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Message):
                    self.echoed += len(event.data)
                    kind = BytesMessage if isinstance(event.data, bytes) else TextMessage
                    writer.write(ws.send(kind(data=event.data, message_finished=event.message_finished)))
                elif isinstance(event, Ping):
                    writer.write(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    writer.write(ws.send(event.response()))
                    await writer.drain()
                    return
            await writer.drain()

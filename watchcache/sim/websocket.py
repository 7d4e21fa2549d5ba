"""The server end of a WebSocket, for the simulated cluster's exec, attach and port-forward.

The HTTP server hands the upgraded connection over (``Response.switch_protocols``); framing,
masking, fragmentation, ping/pong and the closing handshake are wsproto's. Bounded both
ways: ``send`` waits while the client's write buffer is above its high-water mark, and
reading pauses while more than ``_MAX_QUEUED`` received bytes wait for the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Message, Ping, TextMessage
from wsproto.utilities import LocalProtocolError, RemoteProtocolError, generate_accept_token

from watchcache import apierrors
from watchcache.http.flowcontrol import ConnectionClosed, FlowControl
from watchcache.http.request import Request
from watchcache.http.response import Response

_MAX_QUEUED = 1 << 20


def choose_subprotocol(request: Request, supported: list[str]) -> str:
    """The first subprotocol the client offers that is supported ("" when it offers none), as
    kube's WebSocket servers choose; 400 if none is."""
    offered = [p.strip() for p in request.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    for protocol in offered or [""]:
        if protocol in supported:
            return protocol
    raise apierrors.bad_request(
        f"unable to upgrade: requested protocol(s) are not supported: {offered}; supports {supported}"
    )


class WebSocket(asyncio.Protocol):
    """One accepted WebSocket; whole binary messages in, binary messages out."""

    def __init__(self) -> None:
        self.ws = Connection(ConnectionType.SERVER)
        self.transport: asyncio.Transport | None = None
        self.flow = FlowControl()
        self.received: deque[bytes] = deque()
        self.queued = 0
        self.partial = bytearray()
        self.closed = False  # the client closed (or the connection was lost): no more messages
        self.wakeup: asyncio.Future[None] | None = None
        self.paused = False

    @classmethod
    def accept(cls, request: Request, response: Response, subprotocol: str) -> WebSocket:
        """Answer the handshake (RFC 6455 4.2.2) and take the connection over."""
        key = request.headers.get("sec-websocket-key", "")
        if request.method != "GET" or request.headers.get("sec-websocket-version") != "13" or not key:
            raise apierrors.bad_request("a WebSocket upgrade needs GET, Sec-WebSocket-Version: 13 and a key")
        head = [
            "HTTP/1.1 101 Switching Protocols",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Accept: {generate_accept_token(key.encode('latin-1')).decode('ascii')}",
        ]
        if subprotocol:
            head.append(f"Sec-WebSocket-Protocol: {subprotocol}")
        session = cls()
        try:
            session.transport, early = response.switch_protocols(
                "\r\n".join([*head, "", ""]).encode("latin-1"), session
            )
        except ConnectionClosed:
            session.closed = True
            session.flow.closing()
            return session
        if early:
            session.data_received(early)
        return session

    # -- asyncio.Protocol (the switched connection's events)

    def data_received(self, data: bytes) -> None:
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except RemoteProtocolError:
            self._lost()
            return
        for event in events:
            if isinstance(event, Message):
                payload = event.data.encode() if isinstance(event, TextMessage) else event.data
                self.partial += payload
                if event.message_finished:
                    self.received.append(bytes(self.partial))
                    self.queued += len(self.partial)
                    self.partial.clear()
            elif isinstance(event, Ping):
                self._write(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if self.ws.state == ConnectionState.REMOTE_CLOSING:
                    self._write(self.ws.send(event.response()))
                self.closed = True
                if self.transport is not None:
                    self.transport.close()
        if self.queued > _MAX_QUEUED and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._lost()
        return False

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
        self.flow.connection_lost()

    # -- for the session

    async def receive(self) -> bytes | None:
        """The next whole message (text as UTF-8); None once the client has closed."""
        while not self.received:
            if self.closed:
                return None
            self.wakeup = asyncio.get_running_loop().create_future()
            await self.wakeup
        data = self.received.popleft()
        self.queued -= len(data)
        if self.paused and self.queued <= _MAX_QUEUED // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def send(self, data: bytes) -> None:
        """One binary message; waits while the client is slow. Raises ConnectionClosed if it left."""
        if self.flow.closed or self.ws.state != ConnectionState.OPEN:
            raise ConnectionClosed("websocket closed")
        self._write(self.ws.send(BytesMessage(data=data)))
        await self.flow.drain()

    def close(self, code: int = 1000) -> None:
        """Start the closing handshake, then close the connection."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.ws.state == ConnectionState.OPEN:
            with contextlib.suppress(LocalProtocolError):
                self._write(self.ws.send(CloseConnection(code=code)))
        self.transport.close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _lost(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

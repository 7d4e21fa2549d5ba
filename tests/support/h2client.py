"""A small HTTP/2 client on a real TLS socket (asyncio + the ``h2`` library's client connection).

It speaks real bytes to the server under test and records, per stream, what arrived: the
response headers, the body, END_STREAM or RST_STREAM; and for the connection, GOAWAY. Flow
control is the test's: ``ack=False`` streams never reopen their window, to play a client that
stopped reading one watch; the connection window is opened wide (as Go's client does, 1 GB) so
one stalled stream cannot stall the others through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events


@dataclass
class Stream:
    sid: int
    headers: dict[str, str] = field(default_factory=dict)
    header_lines: list[tuple[str, str]] = field(default_factory=list)  # as received, repeats kept
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None  # the error code of a RST_STREAM from the server
    ack: bool = True  # reopen the window as data arrives
    unacked: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int:
        return int(self.headers.get(":status", "0"))

    def json(self) -> Any:
        return json.loads(bytes(self.data))

    def events(self) -> list[dict[str, Any]]:
        """The watch events received whole (a line cut by a frame boundary waits for its end)."""
        whole = bytes(self.data).rpartition(b"\n")[0]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]


def client_context(alpn: tuple[str, ...] = ("h2",)) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(list(alpn))
    return ctx


class H2Client:
    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.streams: dict[int, Stream] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self._task: asyncio.Task[None] | None = None
        self.alpn: str | None = None

    @classmethod
    async def connect(cls, host: str, port: int, *, settings: bool = True) -> H2Client:
        """Connected, preface and SETTINGS sent; with ``settings=False`` the server's SETTINGS are not read
        yet (so the client does not know its limits: a test can exceed them)."""
        self = cls()
        self.reader, self.writer = await asyncio.open_connection(host, port, ssl=client_context())
        self.alpn = self.writer.get_extra_info("ssl_object").selected_alpn_protocol()
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1 << 30)
        self.flush()
        if settings:
            self.start()
        return self

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._read())

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    def request(
        self,
        path: str,
        *,
        method: str = "GET",
        headers: list[tuple[str, str]] | None = None,
        body: bytes | None = None,
        end: bool = True,
        ack: bool = True,
    ) -> Stream:
        sid = self.conn.get_next_available_stream_id()
        fields = [(":method", method), (":scheme", "https"), (":authority", "test"), (":path", path)]
        fields += headers or []
        self.conn.send_headers(sid, fields, end_stream=end and body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        stream = self.streams[sid] = Stream(sid, ack=ack)
        self.flush()
        return stream

    def ack(self, stream: Stream) -> None:
        """Reopen ``stream``'s window for what it received (and read on from now on)."""
        stream.ack = True
        if stream.unacked:
            self.conn.acknowledge_received_data(stream.unacked, stream.sid)
            stream.unacked = 0
        self.flush()

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for event in self.conn.receive_data(data):
                    self._event(event)
                self.flush()
                self.changed.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            self.changed.set()
            for stream in self.streams.values():
                stream.changed.set()

    def _event(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        stream = self.streams.get(sid) if sid else None
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.header_lines = list(event.headers)  # type: ignore[arg-type]
            stream.headers = dict(stream.header_lines)
        elif isinstance(event, h2.events.DataReceived) and stream is not None:
            stream.data += event.data
            if stream.ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                stream.unacked += event.flow_controlled_length
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
            if event.error_code == 0:
                # As Go's client (h2 would refuse every later frame): the streams up to
                # last_stream_id go on after a graceful GOAWAY.
                self.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        if stream is not None:
            stream.changed.set()

    async def until(self, check: Any, timeout: float = 5.0) -> None:
        """Until ``check()`` is true, re-checked as frames arrive."""

        async def wait() -> None:
            while not check():
                task = self._task
                if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                    raise AssertionError("the client failed reading") from task.exception()
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def response(self, stream: Stream, timeout: float = 5.0) -> Stream:
        """Until the stream ended or was reset."""
        await self.until(lambda: stream.ended or stream.reset is not None or self.closed.is_set(), timeout)
        return stream

    async def get(self, path: str, **kw: Any) -> Stream:
        return await self.response(self.request(path, **kw))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
            await self.writer.wait_closed()

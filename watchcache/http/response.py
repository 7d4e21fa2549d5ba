"""What a handler answers through, whatever the wire: one HTTP/1.1 exchange or one HTTP/2 stream.

Handlers (cached reads, watches, pass-through, tunnels) are written against this interface
only, so the same code serves ``HTTP/1.1`` (:class:`watchcache.http.h1response.H1Response`:
writes go straight to the transport) and ``h2`` (:class:`watchcache.http.h2stream.H2Response`:
writes queue DATA on a stream, sent as its flow-control windows allow). ``writable`` and
``drain`` are the back-pressure of either: the transport's buffer, or the stream's queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["Response"]


class Response(Protocol):
    #: The status code sent (0 until the head is written): for request metrics and logs.
    status: int
    #: The answer may go on after its handler returned (HTTP/1.1: the connection moves on once it
    #: is finished too), so a long-running answer (a watch) need not keep a handler waiting.
    #: False on HTTP/2, whose connection treats a returned handler's unfinished stream as stuck.
    outlives_handler: bool

    def send(
        self,
        status: int,
        body: bytes | Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """A whole response with its length, at once."""

    async def send_stream(
        self,
        status: int,
        parts: Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        slice_bytes: int = 1 << 20,
    ) -> None:
        """A response with its length whose body is written in slices as the client reads (large LISTs)."""

    def start_chunked(
        self,
        status: int,
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Start a streamed body (a watch, a pass-through of unknown length)."""

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """Write ``parts`` as one piece of the streamed body; returns its size (0: nothing written)."""

    def end_chunked(self) -> None:
        """End the streamed body; idempotent."""

    @property
    def writable(self) -> bool:
        """False while the client is behind (buffer above its high-water mark) or gone."""

    async def drain(self) -> None:
        """Until writable again; raises ``ConnectionClosed`` if the client went away."""

    def write_buffer_size(self) -> int:
        """Bytes written and not yet sent to the client."""

    @property
    def closed(self) -> bool:
        """The client is gone (connection closed, or the stream reset): writes are dropped."""

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        """Run ``cb`` once when the client goes away while this response is current."""

    @property
    def started(self) -> bool:
        """The head was written."""

    def abort(self) -> None:
        """Drop this response now, discarding what is unsent; the client sees it truncated
        (a request past its deadline gives back its seat and its bytes: invariant 14)."""

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        """Hand the connection to ``protocol`` after ``head`` (101); HTTP/1.1 only."""

"""Write-side flow control for one HTTP connection.

The transport calls ``pause_writing``/``resume_writing`` when its buffer crosses the
high/low water marks; here they only flip a flag and wake ``drain()`` waiters, so
the transport callbacks stay O(1) however many tasks wait on one connection.
"""

from __future__ import annotations

import asyncio

__all__ = ["ConnectionClosed", "FlowControl"]


class ConnectionClosed(Exception):
    """The connection was closed (by the peer or by us) while waiting to write."""


class FlowControl:
    """Writable/paused state of one connection, and waiting for it to change."""

    __slots__ = ("_event", "closed", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.closed = False
        # Created on the first pause only: most connections never fill their buffer.
        # An Event (not a shared Future) so that one cancelled drain() cannot cancel the others.
        self._event: asyncio.Event | None = None

    @property
    def writable(self) -> bool:
        return not self.paused and not self.closed

    def pause_writing(self) -> None:
        self.paused = True
        if self._event is not None:
            self._event.clear()

    def resume_writing(self) -> None:
        self.paused = False
        if self._event is not None:
            self._event.set()

    def closing(self) -> None:
        """No more writes will succeed: wake every waiter so it can raise."""
        self.closed = True
        if self._event is not None:
            self._event.set()

    connection_lost = closing

    async def drain(self) -> None:
        """Return once writable; raise :class:`ConnectionClosed` if the connection closes first."""
        if self.closed:
            raise ConnectionClosed("connection closed")
        if not self.paused:
            return
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()  # starts cleared: we are paused
        await event.wait()
        if self.closed:
            raise ConnectionClosed("connection closed")

"""How much HTTP/1.1 reads from a socket at a time, into one buffer per event loop.

With admission before the body (``request.Admit``), a request that waits holds what was read of it
when its head ended: Go's server reads through a 4 KiB ``bufio.Reader``, so its queued request
holds its head and at most 4 KiB of body. A plain ``asyncio.Protocol`` is handed what the loop
read, up to 256 KiB at a time (uvloop's read buffer): a client that sent its body at once would
have 256 KiB of it held while it waits. So :class:`~watchcache.http.h1protocol.H1Protocol` is a
``BufferedProtocol`` whose reads are :data:`HEAD_READ` bytes while no body is being read, and
:data:`BODY_READ` while one is (and always, without admission before the body). The buffer is the
loop's, shared by its connections (the parser copies what it keeps before the next read).
"""

from __future__ import annotations

import asyncio
import weakref

__all__ = ["BODY_READ", "HEAD_READ", "read_views"]

HEAD_READ = 4096
BODY_READ = 256 * 1024

_BUFFERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[memoryview, memoryview]] = (
    weakref.WeakKeyDictionary()
)


def read_views(loop: asyncio.AbstractEventLoop) -> tuple[memoryview, memoryview]:
    """The loop's read buffer, as (a head read, a body read) views of it."""
    views = _BUFFERS.get(loop)
    if views is None:
        buffer = memoryview(bytearray(BODY_READ))
        views = _BUFFERS[loop] = (buffer[:HEAD_READ], buffer)
    return views

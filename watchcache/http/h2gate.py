"""HTTP/2: a stream admitted before its body is read, so that a queued stream holds its head and at most its window.

As on HTTP/1.1 (:mod:`watchcache.http.h1gate`), kube-apiserver's flow control waits before any
handler reads a request body. A stream whose HEADERS do not end it gets its admission at once, in
the task that then runs its handler (so the handler sees what admission put in its context).
While it waits, the DATA it receives is not acknowledged: its stream window (our
SETTINGS_INITIAL_WINDOW_SIZE, kube's MaxUploadBufferPerStream, 256 KiB) is all a queued stream
can send and hold. The connection window is withheld for those bytes too, as Go's server does
(it returns both as its handler reads the body): it is the stream window times the stream limit
(kube's MaxUploadBufferPerConnection), so the streams queued can never take it all from one that
is not, and ``h2`` reopens a closed window as soon as any byte is acknowledged. On its grant the
withheld bytes are acknowledged, the announced length is held against the request buffer, and the
body clock starts; a refusal (kube's 429) ends the stream with the body unread (RST_STREAM
NO_ERROR after the answer, as ``H2Response`` does for any early answer), and what it withheld,
or any DATA still in flight, is acknowledged at once. A stream the client resets while it waits
leaves its queue (``cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol

from watchcache import apierrors
from watchcache.http.h2stream import H2Response
from watchcache.http.request import Admit, Admitted, Request

__all__ = ["GatedStreams", "admit_then_handle"]

logger = logging.getLogger("watchcache.http.h2gate")


class GatedStreams(Protocol):
    """What a gated stream's task asks of its connection (``H2Protocol``)."""

    def grant_body(self, stream: H2Response) -> None:
        """The stream is admitted: acknowledge what it withheld, hold its announced body (raises a
        StatusError over the request buffer), start its body clock."""

    def gate_refused(self, stream: H2Response) -> None:
        """The stream was answered before its body was read: drop and acknowledge the rest."""

    def run(self, stream: H2Response, request: Request) -> Awaitable[None]:
        """The handler, for the complete request."""


async def admit_then_handle(
    conn: GatedStreams, stream: H2Response, request: Request, admit: Admit, body: asyncio.Future[None]
) -> None:
    """Admission, then the body (``body``: its arrival), then the handler with the grant."""
    admitted: Admitted | None = None
    try:
        admitted = await admit(request, stream)
    except asyncio.CancelledError:
        return  # the stream was reset, or the connection lost: admission left its queue
    except apierrors.StatusError as err:
        _answer(stream, err)
    except Exception:
        logger.exception("admission failed for %s %s", request.method, request.path)
        _answer(stream, apierrors.internal_error())
    if admitted is None:
        if not stream.started:
            logger.error("admission of %s %s gave no grant and no answer", request.method, request.path)
            _answer(stream, apierrors.internal_error())
        conn.gate_refused(stream)
        return
    try:
        try:
            conn.grant_body(stream)
        except apierrors.StatusError as err:
            _answer(stream, err)
            conn.gate_refused(stream)
            return
        await body
        request.admitted = admitted
        await conn.run(stream, request)
    except asyncio.CancelledError:
        return  # gone (or refused for its body) before its handler: the grant goes back below
    finally:
        admitted.release()  # the handler gives it back at its end; this is for one that never took it


def _answer(stream: H2Response, err: apierrors.StatusError) -> None:
    if not stream.started and not stream.reset:
        extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
        stream.send(err.code, err.body(), content_type=err.content_type, headers=extra)

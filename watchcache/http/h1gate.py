"""HTTP/1.1: a request admitted before its body is read, so that a queued request holds only its head.

kube-apiserver's flow control (``WithPriorityAndFairness``) waits before any handler reads a
request's body, and Go's server reads nothing of it meanwhile. So does
:class:`~watchcache.http.h1protocol.H1Protocol` when it is given an ``Admit``: at the end of a
head whose body is to come, reading pauses, and a :class:`BodyGate` runs the request's admission;
on its grant reading resumes, the body is read (the limits of any body apply), and the handler
runs with the grant (``Request.admitted``), in the same task, so that what admission learnt
(the authenticated user, in a context variable) is the handler's too.

A refusal (kube's 429, or any Status the admission raised) is answered without reading the
body, and the connection closes after it (``Connection: close``): the unread body would
otherwise be read as the next request. Go's server does the same above 256 KiB of unread body
(``maxPostHandlerReadBytes``); below, it reads and discards it to keep the connection.

While the request waits nothing is read, so a client that goes away is not seen by a read (nor
is it by Go's server, which reads no further either): its socket is polled for a hang-up every
:data:`GONE_CHECK` seconds, and a client gone leaves its queue (``cancelled``). A hang-up is
seen when the client's FIN or reset reaches us: a FIN queued behind body bytes our full
receive window does not take stays unseen until the wait ends (at its budget, a 429).
"""

from __future__ import annotations

import asyncio
import logging
import select
from collections.abc import Awaitable
from typing import Protocol

from watchcache import apierrors
from watchcache.http.h1response import H1Connection, H1Response
from watchcache.http.request import Admit, Admitted, Request

__all__ = ["GONE_CHECK", "GRANTED", "HEAD_IN", "LINGER", "QUEUED", "BodyGate", "GatedConnection", "close_unread"]

logger = logging.getLogger("watchcache.http.h1gate")

# A message whose body waits for its admission, by step: its head is in (admission starts once
# the requests before it on its connection are answered); it waits in its queue, reading paused;
# it was granted, and its body is being read.
HEAD_IN, QUEUED, GRANTED = 1, 2, 3
#: Go's rstAvoidanceDelay: after an answer that leaves a body unread, the connection is closed
#: this much later (its write side at once), so that the client reads the answer before a reset.
LINGER = 0.5
#: How often a queued request's socket is polled for its client's hang-up, in seconds.
GONE_CHECK = 1.0
_GONE_EVENTS = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)

#: A complete request for its handler: the request, its keep-alive, and the request bytes it holds.
Complete = tuple[Request, bool, int]


class GatedConnection(H1Connection, Protocol):
    """What a :class:`BodyGate` asks of its connection (``H1Protocol``), besides its responses' interface."""

    def grant_body(self) -> None:
        """The request is granted: hold its announced body, send 100 Continue if asked, resume reading.
        Raises a StatusError (the request buffer is full)."""

    def gate_refused(self, refusal: H1Response, unread: bool) -> None:
        """The request was answered through ``refusal`` (``unread``: before its body was all read)."""

    def run_admitted(self, complete: Complete) -> Awaitable[None]:
        """The handler, for the complete request (its grant in ``Request.admitted``)."""


class BodyGate:
    """The admission of one request whose body is to come, until its handler starts."""

    __slots__ = ("_conn", "_done", "_error", "_gone_timer", "_loop", "_task", "refusal", "request")

    def __init__(self, conn: GatedConnection, request: Request) -> None:
        self._conn = conn
        self.request = request
        # The answer of a refusal: with the body unread, the connection's last (``Connection: close``).
        self.refusal = H1Response(
            conn, False, request.method == "HEAD", request.http_version == "1.0", request.audit_id()
        )
        self._loop = asyncio.get_running_loop()
        # The body is in (the complete request), or failed (None, and ``_error``).
        self._done: asyncio.Future[Complete | None] = self._loop.create_future()
        self._error: apierrors.StatusError | None = None
        self._gone_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, admit: Admit, transport: asyncio.BaseTransport) -> asyncio.Task[None]:
        """Admit, read the body, handle: the task doing it (the caller keeps it)."""
        self._task = task = self._loop.create_task(self._run(admit))
        sock = transport.get_extra_info("socket")  # polled for the client's hang-up while queued
        if sock is not None:
            self._gone_timer = self._loop.call_later(GONE_CHECK, self._check_gone, sock.fileno())
        return task

    def body_complete(self, complete: Complete) -> None:
        self._done.set_result(complete)

    def body_failed(self, error: apierrors.StatusError) -> None:
        """The body was refused (too large, too slow, malformed): the error is the answer."""
        self._error = error
        self._done.set_result(None)

    def cancel(self) -> None:
        """The connection was lost: the admission leaves its queue, or gives its grant back."""
        self._stop_watch()
        if self._task is not None:
            self._task.cancel()

    async def _run(self, admit: Admit) -> None:
        conn, refusal, done = self._conn, self.refusal, self._done
        admitted: Admitted | None = None
        try:
            admitted = await admit(self.request, refusal)
        except asyncio.CancelledError:
            return
        except apierrors.StatusError as err:
            _answer(refusal, err)
        except Exception:
            logger.exception("admission failed for %s %s", self.request.method, self.request.path)
            _answer(refusal, apierrors.internal_error())
        finally:
            self._stop_watch()
        if admitted is None:
            self._refused()
            return
        try:
            if not done.done():
                conn.grant_body()
            complete = await done
            if complete is None:
                assert self._error is not None
                raise self._error
        except asyncio.CancelledError:
            admitted.release()
            return
        except apierrors.StatusError as err:
            admitted.release()
            _answer(refusal, err)
            self._refused()
            return
        complete[0].admitted = admitted
        try:
            await conn.run_admitted(complete)
        finally:
            admitted.release()  # the handler gives it back at its end; this is for one that never took it

    def _refused(self) -> None:
        done = self._done
        unread = not done.done() or done.result() is None
        if not self.refusal.started:
            logger.error("admission of %s %s gave no grant and no answer", self.request.method, self.request.path)
            self.refusal.send(500, apierrors.internal_error().body())
        self._conn.gate_refused(self.refusal, unread)

    def _check_gone(self, fd: int) -> None:
        self._gone_timer = None
        if self._conn.lost:
            return
        poller = select.poll()
        poller.register(fd, _GONE_EVENTS)
        if poller.poll(0):
            logger.debug("%s %s: the client went away while queued", self.request.method, self.request.path)
            self._conn.abort()  # its connection_lost cancels the admission
            return
        self._gone_timer = self._loop.call_later(GONE_CHECK, self._check_gone, fd)

    def _stop_watch(self) -> None:
        if self._gone_timer is not None:
            self._gone_timer.cancel()
            self._gone_timer = None


def _answer(refusal: H1Response, err: apierrors.StatusError) -> None:
    if not refusal.started:
        extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
        refusal.send(err.code, err.body(), content_type=err.content_type, headers=extra)


def close_unread(transport: asyncio.Transport) -> None:
    """Close a connection whose request body was left unread: closed at once, the bytes unread in our
    socket would make the kernel reset the connection, maybe before the client read the answer."""
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(LINGER, transport.close)

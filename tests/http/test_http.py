"""The HTTP/1.1 protocol over real loopback sockets (server on a uvloop thread: tests/support/serverthread.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO

import pytest

from harness.waiting import wait_until
from tests.support.http1 import GET, at_eof, exchange, read_reply
from tests.support.serverthread import Serve
from watchcache import apierrors
from watchcache.flags import build_parser
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.limits import HttpLimits
from watchcache.http.request import Request
from watchcache.http.response import Response


async def echo(req: Request, resp: Response) -> None:
    """Echo the parsed request back as JSON."""
    if req.path == "/sleep":
        await asyncio.sleep(float(req.query_value("s") or 0))
    doc = {
        "method": req.method,
        "raw_path": req.raw_path.decode(),
        "path": req.path,
        "query": req.query,
        "headers": req.headers,
        "lines": req.header_lines(),
        "body": req.body.decode(),
        "version": req.http_version,
        "remote": req.remote,
    }
    resp.send(200, [b"", json.dumps(doc).encode()])


def test_simple_get(serve: Serve) -> None:
    srv = serve(echo)
    head = b"GET /api/v1/na%20me?a=1&a=2&b=&c=x%2By HTTP/1.1\r\nHost: t\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\n"
    reply, _ = exchange(srv, head)
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["cache-control"] == "no-cache, private"
    assert reply.headers["date"].endswith(" GMT")
    assert int(reply.headers["content-length"]) == len(reply.body)
    doc = reply.json()
    assert doc["method"] == "GET" and doc["version"] == "1.1"
    assert doc["raw_path"] == "/api/v1/na%20me?a=1&a=2&b=&c=x%2By"
    assert doc["path"] == "/api/v1/na me"
    assert doc["query"] == {"a": ["1", "2"], "b": [""], "c": ["x+y"]}
    assert doc["headers"]["x-multi"] == "1, 2"
    # For forwarding: each line as sent (kube reads each Impersonate-Group line as one group).
    assert [v for n, v in doc["lines"] if n == "x-multi"] == ["1", "2"]
    assert ["host", "t"] in doc["lines"]
    assert doc["remote"].startswith("127.0.0.1:")


def test_repeated_header_lines_are_kept_per_request(serve: Serve) -> None:
    srv = serve(echo)
    sock = srv.connect()
    f: BinaryIO = sock.makefile("rb")
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: t\r\nX-G: a\r\nX-G: b, c\r\nx-g: d\r\nX-One: e, f\r\n\r\n" + GET % b"/b")
    first, second = read_reply(f).json(), read_reply(f).json()
    assert first["headers"]["x-g"] == "a, b, c, d"
    assert [v for n, v in first["lines"] if n == "x-g"] == ["a", "b, c", "d"]
    assert ["x-one", "e, f"] in first["lines"]
    assert second["lines"] == [["host", "t"]]  # nothing carried over to the next request


def test_a_path_that_is_not_utf8_is_the_handlers(serve: Serve) -> None:
    """Go reads a path's bytes (kube's mux 404s ``/a%ff``): not refused as a request target."""
    reply, _ = exchange(serve(echo), GET % b"/a%ff")
    assert reply.status == 200 and reply.json()["path"] == "/a\ufffd"


def test_keep_alive_two_requests_then_http10_close(serve: Serve) -> None:
    srv = serve(echo)
    sock = srv.connect()
    f: BinaryIO = sock.makefile("rb")
    for path in (b"/one", b"/two"):
        sock.sendall(GET % path)
        reply = read_reply(f)
        assert reply.status == 200 and reply.json()["path"] == path.decode()
        assert "connection" not in reply.headers
    sock.sendall(b"GET /three HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    reply = read_reply(f)
    assert reply.headers["connection"] == "close" and at_eof(f)
    reply, f = exchange(srv, b"GET /old HTTP/1.0\r\n\r\n")
    assert reply.json()["version"] == "1.0" and reply.headers["connection"] == "close" and at_eof(f)


def test_pipelined_requests_answered_in_order_one_at_a_time(serve: Serve) -> None:
    log: list[str] = []

    async def handler(req: Request, resp: Response) -> None:
        log.append("start " + req.path)
        await asyncio.sleep(float(req.query_value("s") or 0))
        log.append("end " + req.path)
        resp.send(200, req.path.encode(), content_type="text/plain")

    srv = serve(handler)
    sock = srv.connect()
    sock.sendall(GET % b"/a?s=0.2" + GET % b"/b" + GET % b"/c?s=0.05" + GET % b"/d")
    f = sock.makefile("rb")
    assert [read_reply(f).body for _ in range(4)] == [b"/a", b"/b", b"/c", b"/d"]
    assert log == [f"{edge} /{p}" for p in "abcd" for edge in ("start", "end")]


def test_post_with_content_length(serve: Serve) -> None:
    body = b'{"kind":"Pod"}'
    reply, _ = exchange(serve(echo), b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert reply.json()["body"] == body.decode() and reply.json()["method"] == "POST"


def test_chunked_request_body(serve: Serve) -> None:
    raw = b"PUT /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    reply, _ = exchange(serve(echo), raw)
    assert reply.status == 200 and reply.json()["body"] == "hello world"


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        b"Content-Length: 5\r\nContent-Length: 6\r\n",
        b"Content-Length: 5\r\nContent-Length: 5\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    ],
    ids=["cl-te", "te-cl", "two-cl", "same-cl-twice", "te-gzip", "te-twice"],
)
def test_request_smuggling_defences(serve: Serve, headers: bytes) -> None:
    reply, f = exchange(serve(echo), b"POST / HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n5\r\nhello\r\n0\r\n\r\n")
    assert reply.status == 400
    assert reply.headers["content-type"] == "application/json"
    status = reply.json()
    assert status["kind"] == "Status" and status["reason"] == "BadRequest" and status["code"] == 400
    assert reply.headers["connection"] == "close" and at_eof(f)


def test_garbage_request_line_is_400(serve: Serve) -> None:
    srv = serve(echo)
    reply, f = exchange(srv, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert reply.status == 400 and reply.json()["reason"] == "BadRequest" and at_eof(f)
    # Behind a pipelined request, the error waits its turn instead of cutting into that response.
    reply, f = exchange(srv, GET % b"/sleep?s=0.2" + b"BAD\x00LINE\r\n\r\n")
    assert reply.status == 200 and reply.json()["path"] == "/sleep"
    assert read_reply(f).status == 400 and at_eof(f)


async def with_audit_id(req: Request, resp: Response) -> None:
    """Answer with the handler's own Audit-Id when asked to (as a passed-through answer carries the upstream's)."""
    own = req.query_value("own")
    resp.send(200, b"{}", headers=(("Audit-Id", own),) if own else ())


def test_every_answer_carries_kubes_audit_id_the_clients_own_or_a_new_uuid(serve: Serve) -> None:
    """kube-apiserver's first filter (WithAuditInit) sets Audit-Id on every answer it writes."""
    srv = serve(with_audit_id)
    first, _ = exchange(srv, GET % b"/a")
    second, _ = exchange(srv, GET % b"/a")
    ids = [first.headers["audit-id"], second.headers["audit-id"]]
    assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids) and ids[0] != ids[1], ids
    # The client's own, echoed (its first line's, as Go's Header.Get reads it)
    reply, _ = exchange(srv, b"GET /a HTTP/1.1\r\nHost: t\r\nAudit-ID: mine-1\r\n\r\n")
    assert reply.headers["audit-id"] == "mine-1"
    reply, _ = exchange(srv, b"GET /a HTTP/1.1\r\nHost: t\r\naudit-id: one\r\nAudit-Id: two\r\n\r\n")
    assert reply.headers["audit-id"] == "one"
    # The handler's own wins, once (read_reply refuses a repeated header)
    reply, _ = exchange(srv, b"GET /a?own=upstream HTTP/1.1\r\nHost: t\r\nAudit-ID: mine-1\r\n\r\n")
    assert reply.headers["audit-id"] == "upstream"
    # What is not a request gets Go's server's answer, before any of kube's filters: none
    reply, _ = exchange(srv, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert reply.status == 400 and "audit-id" not in reply.headers


def test_header_section_over_limit_is_431(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(max_header_bytes=1024))
    reply, _ = exchange(srv, GET % b"/small")
    assert reply.status == 200
    fields = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(30))
    reply, f = exchange(srv, b"GET / HTTP/1.1\r\n" + fields + b"\r\n")
    assert reply.status == 431 and reply.json()["reason"] == "RequestHeaderFieldsTooLarge" and at_eof(f)
    # A single header that never ends: bounded by the bytes fed to the parser, not by a callback.
    # The chunk where the head starts is not counted, and how the sends are split into reads is
    # the kernel's business: keep sending 700 bytes until the server answers (each is under the limit).
    sock = srv.connect()
    sock.sendall(b"GET / HTTP/1.1\r\nX-Endless: ")
    for _ in range(50):
        sock.sendall(b"v" * 700)
        if select.select([sock], [], [], 0.05)[0]:
            break
    f = sock.makefile("rb")
    assert read_reply(f).status == 431 and at_eof(f)


def test_body_over_limit_is_413(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(max_body_bytes=100))
    reply, _ = exchange(srv, b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + b"x" * 100)
    assert reply.status == 200
    # Refused on the announced length, before any body (and without 100 Continue).
    reply, f = exchange(srv, b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\nExpect: 100-continue\r\n\r\n")
    assert reply.status == 413 and reply.json()["reason"] == "RequestEntityTooLarge" and at_eof(f)
    chunk = b"40\r\n" + b"x" * 64 + b"\r\n"
    head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    reply, f = exchange(srv, head + chunk * 2 + b"0\r\n\r\n")
    assert reply.status == 413 and at_eof(f)


def test_head_gets_content_length_without_body(serve: Serve) -> None:
    async def handler(req: Request, resp: Response) -> None:
        resp.send(200, [b"0123", b"456789"], content_type="text/plain")

    srv = serve(handler)
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + GET % b"/after")
    head = read_reply(f, head_only=True)
    assert head.status == 200 and head.headers["content-length"] == "10"
    after = read_reply(f)  # would start with the HEAD body if it had been written
    assert after.status == 200 and after.body == b"0123456789"


def test_expect_100_continue(serve: Serve) -> None:
    srv = serve(echo)
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(b"POST /c HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert f.readline() == b"HTTP/1.1 100 Continue\r\n" and f.readline() == b"\r\n"
    sock.sendall(b"data")
    assert read_reply(f).json()["body"] == "data"


def test_handler_exception_is_500_status_without_traceback(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    async def handler(req: Request, resp: Response) -> None:
        raise RuntimeError("secret-detail")

    with caplog.at_level(logging.ERROR, logger="watchcache.http.h1protocol"):
        reply, f = exchange(serve(handler), GET % b"/boom")
    assert reply.status == 500
    assert reply.body == apierrors.internal_error().body()
    assert b"secret" not in reply.body and b"Traceback" not in reply.body
    assert reply.headers["connection"] == "close" and at_eof(f)
    assert any(r.name == "watchcache.http.h1protocol" and r.exc_info for r in caplog.records)


def test_handler_returning_without_response_is_500(serve: Serve) -> None:
    async def handler(req: Request, resp: Response) -> None:
        return None

    reply, _ = exchange(serve(handler), GET % b"/")
    assert reply.status == 500 and reply.json()["reason"] == "InternalError"


def test_status_error_code_body_and_retry_after(serve: Serve) -> None:
    err = apierrors.too_many_requests("slow down", 7)

    async def handler(req: Request, resp: Response) -> None:
        if req.path == "/gone":
            raise apierrors.resource_expired("too old")
        raise err

    srv = serve(handler)
    reply, _ = exchange(srv, GET % b"/busy")
    assert reply.status == 429 and reply.headers["retry-after"] == "7" and reply.body == err.body()
    reply, _ = exchange(srv, GET % b"/gone")
    assert reply.status == 410 and "retry-after" not in reply.headers and reply.json()["reason"] == "Expired"


def test_header_injection_is_refused(serve: Serve) -> None:
    async def handler(req: Request, resp: Response) -> None:
        resp.send(200, b"{}", headers=[("X-Evil", "a\r\nSet-Cookie: x=1")])

    reply, _ = exchange(serve(handler), GET % b"/")
    assert reply.status == 500 and "set-cookie" not in reply.headers


def test_chunked_streaming_one_chunk_per_write(serve: Serve) -> None:
    async def handler(req: Request, resp: Response) -> None:
        resp.start_chunked(200, headers=[("X-Watch", "1")])
        resp.write_chunk([b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n'])
        resp.write_chunk([])  # ignored: an empty chunk would end the stream
        await asyncio.sleep(0.01)
        resp.write_chunk([b'{"type":"DELETED"}\n'])
        resp.end_chunked()

    srv = serve(handler)
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(GET % b"/watch" + GET % b"/again")
    reply = read_reply(f)
    assert reply.headers["transfer-encoding"] == "chunked" and "content-length" not in reply.headers
    assert reply.headers["x-watch"] == "1"
    assert reply.chunks == [b'{"type":"ADDED"}\n{"type":"MODIFIED"}\n', b'{"type":"DELETED"}\n']
    assert read_reply(f).status == 200  # the connection is reusable after the last chunk


def test_a_streamed_answer_outlives_its_handler_and_the_connection_reads_on(serve: Serve) -> None:
    """As an HTTP/1.1 watch: the handler returns once its stream is set up and the answer ends later,
    from a callback. Meanwhile the connection holds no parser; it makes one again for the next
    request, even one that arrives in pieces, answered once the stream has ended."""
    streams: list[Response] = []

    async def handler(req: Request, resp: Response) -> None:
        if req.path == "/watch":
            assert resp.outlives_handler
            resp.start_chunked(200)
            resp.write_chunk([b"first\n"])
            streams.append(resp)
            return  # the answer goes on
        resp.send(200, req.path.encode(), content_type="text/plain")

    srv = serve(handler)
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(GET % b"/watch")
    wait_until(lambda: streams)
    sock.sendall(b"GET /next HTTP/1.1\r\nHo")
    time.sleep(0.05)
    sock.sendall(b"st: t\r\n\r\n")
    time.sleep(0.05)

    def end() -> None:
        streams[0].write_chunk([b"last\n"])
        streams[0].end_chunked()

    srv.loop.call_soon_threadsafe(end)
    reply = read_reply(f)
    assert reply.chunks == [b"first\n", b"last\n"]
    assert read_reply(f).body == b"/next"
    sock.sendall(GET % b"/third")  # and the connection stays usable
    assert read_reply(f).body == b"/third"


def _streamer(state: dict[str, Any], paused: threading.Event, done: threading.Event) -> Callable[..., Any]:
    """Stream 16 KiB chunks until the transport pauses us, then wait in drain()."""

    async def handler(req: Request, resp: Response) -> None:
        resp.add_close_callback(lambda: state.setdefault("close_callback", True))
        resp.start_chunked(200, content_type="text/plain")
        sent = 0
        while resp.writable and sent < 256 << 20:
            resp.write_chunk([b"x" * 8192, b"y" * 8192])
            sent += 16384
            await asyncio.sleep(0)
        state.update(sent=sent, paused=not resp.writable, buffered=resp.write_buffer_size())
        paused.set()
        try:
            await resp.drain()
        except ConnectionClosed:
            state.update(drain="closed", closed=resp.closed, writable=resp.writable)
        else:
            state.update(drain="returned", writable=resp.writable)
            resp.write_chunk([b"end"])
            resp.end_chunked()
        done.set()

    return handler


def test_flow_control_pauses_and_drain_resumes(serve: Serve) -> None:
    state: dict[str, Any] = {}
    paused, done = threading.Event(), threading.Event()
    srv = serve(_streamer(state, paused, done), HttpLimits(high_water=32 * 1024, low_water=8 * 1024))
    sock = srv.connect(rcvbuf=4096)
    sock.sendall(GET % b"/stream")
    assert paused.wait(10), "the handler never saw writable == False"
    assert state["paused"] and state["buffered"] > 32 * 1024
    assert not done.wait(0.3), "drain() returned while the client was not reading"
    reply = read_reply(sock.makefile("rb"))
    assert done.wait(5) and state["drain"] == "returned" and state["writable"]
    assert len(reply.body) == state["sent"] + 3 and reply.body.endswith(b"end")
    assert reply.chunks[0] == b"x" * 8192 + b"y" * 8192
    assert "close_callback" not in state


def test_client_disconnect_while_streaming(serve: Serve) -> None:
    state: dict[str, Any] = {}
    paused, done = threading.Event(), threading.Event()
    srv = serve(_streamer(state, paused, done), HttpLimits(high_water=32 * 1024, low_water=8 * 1024))
    sock = srv.connect(rcvbuf=4096)
    sock.sendall(GET % b"/stream")
    assert paused.wait(10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.close()
    assert done.wait(5), "drain() never woke up after the peer left"
    assert state["drain"] == "closed" and state["closed"] and not state["writable"]
    assert state["close_callback"] is True


def test_header_timeout_closes_slowloris_only(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(header_timeout=0.5))
    slow = srv.connect()
    slow.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    silent = srv.connect()
    start = time.monotonic()
    reply, _ = exchange(srv, GET % b"/fine")
    assert reply.status == 200
    assert at_eof(slow.makefile("rb")) and at_eof(silent.makefile("rb"))
    assert 0.4 < time.monotonic() - start < 3


def test_keepalive_idle_timeout_closes(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(keepalive_timeout=0.4))
    sock = srv.connect()
    f = sock.makefile("rb")
    for _ in range(2):  # activity keeps it open: each request restarts the idle clock
        sock.sendall(GET % b"/")
        assert read_reply(f).status == 200
        time.sleep(0.25)
    start = time.monotonic()
    assert at_eof(f)
    assert time.monotonic() - start < 2


def test_body_timeout_answers_408_and_closes(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(body_timeout=0.5))
    # A body in time is answered, and the connection stays usable past the timeout.
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(b"POST /in-time HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab")
    time.sleep(0.2)
    sock.sendall(b"cd")
    assert read_reply(f).json()["body"] == "abcd"
    time.sleep(0.5)
    sock.sendall(GET % b"/later")
    assert read_reply(f).status == 200
    # A body that never completes: 408, and the connection is closed.
    for head, drip in (
        (b"POST /cl HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n", b"x"),
        (b"POST /te HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n"),
    ):
        sock = srv.connect()
        start = time.monotonic()
        sock.sendall(head)
        for _ in range(4):  # a slow drip does not extend the deadline
            time.sleep(0.15)
            sock.sendall(drip)
        f = sock.makefile("rb")
        reply = read_reply(f)
        assert reply.status == 408 and reply.json()["reason"] == "Timeout", reply
        assert reply.headers["connection"] == "close" and at_eof(f)
        assert 0.45 < time.monotonic() - start < 3


def test_body_timeout_waits_its_turn_behind_an_earlier_request(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(body_timeout=0.3))
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(GET % b"/sleep?s=0.6" + b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab")
    assert read_reply(f).json()["path"] == "/sleep"
    reply = read_reply(f)
    assert reply.status == 408 and at_eof(f)


@pytest.mark.parametrize(
    ("started", "rest"),
    [
        (b"POST /behind HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab", b"cd"),
        (b"POST /behind HTTP/1.1\r\nHost: t\r\nContent-Le", b"ngth: 4\r\n\r\nabcd"),
    ],
    ids=["body", "head"],
)
def test_time_while_reading_is_paused_does_not_count_against_the_client(
    serve: Serve, started: bytes, rest: bytes
) -> None:
    # 16 queued requests pause reading; a body (or head) started behind them must not time out
    # while the server is the one not reading.
    srv = serve(echo, HttpLimits(body_timeout=0.3, header_timeout=0.3))
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(GET % b"/sleep?s=0.8" + GET % b"/q" * 16 + started)
    assert read_reply(f).json()["path"] == "/sleep"
    sock.sendall(rest)
    replies = [read_reply(f) for _ in range(17)]
    assert [r.status for r in replies] == [200] * 17 and replies[-1].json()["body"] == "abcd"


def test_a_connection_holds_at_most_its_buffer_cap_of_unanswered_requests(serve: Serve) -> None:
    # Cap = one request of the largest size (head 1 KiB + body 64 KiB): requests behind one that
    # is being handled are read only up to it (plus the read that crossed it), not 16 of them.
    release = threading.Event()

    async def handler(req: Request, resp: Response) -> None:
        while req.path == "/block" and not release.is_set():
            await asyncio.sleep(0.005)
        resp.send(200, b"{}")

    limits = HttpLimits(max_header_bytes=1024, max_body_bytes=65536, max_connection_buffer_bytes=0)
    srv = serve(handler, limits)
    sock = srv.connect()
    f = sock.makefile("rb")
    post = b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n" + b"x" * 60000
    sock.sendall(GET % b"/block" + post * 20)  # 1.2 MB; without the cap 16 would be read (~1 MB)
    wait_until(lambda: srv.admission.buffered > 65536)  # it read up to the cap at least
    held = []
    for _ in range(20):
        held.append(srv.admission.buffered)
        time.sleep(0.01)
    assert max(held) <= 1024 + 65536 + 256 * 1024 + 61000, held  # the cap, one read, the message crossing it
    release.set()
    assert [read_reply(f).status for _ in range(21)] == [200] * 21
    f.close()
    sock.close()
    wait_until(lambda: srv.admission.buffered == 0 and srv.admission.connections == 0)


def test_request_bytes_over_the_process_budget_get_429_except_probes(serve: Serve) -> None:
    limits = HttpLimits(max_body_bytes=8000, max_request_buffer_bytes=8200)
    srv = serve(echo, limits)
    holder = srv.connect()
    holder.sendall(b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 8000\r\n\r\n" + b"x" * 10)
    wait_until(lambda: srv.admission.buffered > 8000)
    # A body that does not fit: 429 before any of it is sent (no 100 Continue), and close.
    reply, f = exchange(srv, b"POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 300\r\nExpect: 100-continue\r\n\r\n")
    assert reply.status == 429 and reply.headers["retry-after"] == "1" and at_eof(f)
    status = reply.json()
    assert status["reason"] == "TooManyRequests" and status["details"]["retryAfterSeconds"] == 1
    # So does a head that does not fit, and a chunked body once it stops fitting.
    reply, _ = exchange(srv, b"GET /big HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * 300 + b"\r\n\r\n")
    assert reply.status == 429
    reply, _ = exchange(srv, b"PUT /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n200\r\n" + b"y" * 512)
    assert reply.status == 429
    # Health probes still get through.
    reply, _ = exchange(srv, GET % b"/readyz")
    assert reply.status == 200
    assert srv.admission.rejected["request_buffer"] == 3
    # Once the held request is answered, its bytes are free again.
    holder.sendall(b"x" * 7990)
    assert read_reply(holder.makefile("rb")).status == 200
    reply, _ = exchange(srv, b"POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 300\r\n\r\n" + b"z" * 300)
    assert reply.status == 200
    holder.close()
    wait_until(lambda: srv.admission.buffered == 0)


def test_connection_limits_per_client_429_then_total_closed_at_accept(serve: Serve) -> None:
    srv = serve(echo, HttpLimits(max_connections=3, max_connections_per_client=2))
    first, second = srv.connect(), srv.connect()
    third = srv.connect()  # over the per-client limit: its first request is refused
    third.sendall(GET % b"/x")
    f = third.makefile("rb")
    reply = read_reply(f)
    assert reply.status == 429 and reply.headers["retry-after"] == "1" and at_eof(f)
    assert "connections from this client" in reply.json()["message"]
    wait_until(lambda: srv.admission.connections == 2)
    blocker = srv.connect()  # refused too, but it counts toward the total while open
    wait_until(lambda: srv.admission.connections == 3)
    fourth = srv.connect()  # over the total: closed at once, nothing read or answered
    fourth.sendall(GET % b"/x")
    assert at_eof(fourth.makefile("rb"))
    for sock in (first, second, blocker):
        sock.close()
    wait_until(lambda: srv.admission.connections == 0 and not srv.admission.by_client)
    reply, _ = exchange(srv, GET % b"/again")
    assert reply.status == 200
    assert srv.admission.rejected["connections"] == 1
    assert srv.admission.rejected["connections_per_client"] == 2


def test_by_default_one_address_may_hold_more_connections_than_a_cluster_has_kubelets(serve: Serve) -> None:
    """Behind a load balancer that rewrites source addresses, every kubelet comes from one address:
    the default has no per-address cap (kube-apiserver has none), only the total one. With the old
    default (1,000) the 1,001st connection's request got 429."""
    args = build_parser().parse_args(["serve", "--upstream", "http://127.0.0.1:1"])
    assert args.max_connections_per_client == HttpLimits().max_connections_per_client
    srv = serve(echo, HttpLimits())  # the defaults
    socks = [srv.connect() for _ in range(1_100)]
    try:
        for sock in socks:  # all open at once, then each asks
            sock.sendall(GET % b"/x")
        statuses = [read_reply(sock.makefile("rb")).status for sock in socks]
        assert statuses == [200] * len(socks)
        assert srv.admission.rejected["connections_per_client"] == 0
    finally:
        for sock in socks:
            sock.close()


def test_a_request_holds_its_bytes_until_its_answer_starts(serve: Serve) -> None:
    started, release, seen = threading.Event(), threading.Event(), threading.Event()

    async def handler(req: Request, resp: Response) -> None:
        if req.path == "/stream":  # a watch: answered for a long time
            resp.start_chunked(200)
            started.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
            resp.end_chunked()
        else:
            while not seen.is_set():  # answered once the test has seen its bytes held
                await asyncio.sleep(0.01)
            resp.send(200, b"{}")

    srv = serve(handler)
    sock = srv.connect()
    f = sock.makefile("rb")
    sock.sendall(b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
    wait_until(lambda: srv.admission.buffered > 1000)  # being handled, not answered yet
    seen.set()
    assert read_reply(f).status == 200
    wait_until(lambda: srv.admission.buffered == 0)
    sock.sendall(GET % b"/stream")
    assert started.wait(5)
    wait_until(lambda: srv.admission.buffered == 0)  # streaming: answered, nothing held
    release.set()
    assert read_reply(f).status == 200

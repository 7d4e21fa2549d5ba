"""What a handler sees of a request and what a client sees of its answer, over HTTP/1.1 and over HTTP/2.

Every test runs once per protocol (the ``client_for`` fixture, tests/support/protocols.py), against one
TLS server offering both by ALPN, as uvicorn runs one suite over both of its parsers: the handler and the
``Response`` interface are the same, so the answers must be too. How each protocol frames them is tested
in test_http.py (HTTP/1.1 bytes) and test_http2.py (HTTP/2 frames).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.protocols import ProtocolClient
from watchcache import apierrors
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.limits import HttpLimits
from watchcache.http.request import Request
from watchcache.http.response import Response

ClientFor = Callable[..., ProtocolClient]

pytestmark = pytest.mark.timeout(60)


async def echo(req: Request, resp: Response) -> None:
    """Echo the parsed request back as JSON."""
    doc = {
        "method": req.method,
        "raw_path": req.raw_path.decode(),
        "path": req.path,
        "query": req.query,
        "query_utf8": req.query_utf8,
        "headers": req.headers,
        "lines": req.header_lines(),
        "body": req.body.decode(),
        "version": req.http_version,
        "remote": req.remote,
    }
    resp.send(200, [b"", json.dumps(doc).encode()])


def test_the_handler_sees_the_path_query_and_header_lines_as_sent(client_for: ClientFor) -> None:
    client = client_for(echo)
    reply = client.get("/api/v1/na%20me?a=1&a=2&b=&c=x%2By", headers=[("X-Multi", "1"), ("x-multi", "2")])
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["cache-control"] == "no-cache, private"
    assert reply.headers["date"].endswith(" GMT")
    assert int(reply.headers["content-length"]) == len(reply.content)
    doc = reply.json()
    assert doc["method"] == "GET" and doc["version"] == client.version
    assert doc["raw_path"] == "/api/v1/na%20me?a=1&a=2&b=&c=x%2By"
    assert doc["path"] == "/api/v1/na me"
    assert doc["query"] == {"a": ["1", "2"], "b": [""], "c": ["x+y"]} and doc["query_utf8"] is True
    assert doc["headers"]["x-multi"] == "1, 2"
    # For forwarding: each line as sent (kube reads each Impersonate-Group line as one group).
    assert [v for n, v in doc["lines"] if n == "x-multi"] == ["1", "2"]
    assert doc["headers"]["host"] == f"127.0.0.1:{client.server.port}"
    assert doc["remote"].startswith("127.0.0.1:")


def test_a_request_body_reaches_the_handler_whole(client_for: ClientFor) -> None:
    client = client_for(echo)
    body = b'{"kind":"Pod","data":"' + b"x" * 100_000 + b'"}'  # over one HTTP/2 frame and one read
    doc = client.request("POST", "/p", headers=[("Content-Type", "application/json")], body=body).json()
    assert doc["method"] == "POST" and doc["body"] == body.decode()


def test_a_target_that_is_not_utf8_reaches_the_handler_as_sent(client_for: ClientFor) -> None:
    """kube answers ``/a%ff`` with its mux's 404, not a protocol 400 (it reads bytes): the handler gets
    it, U+FFFD in ``path`` (for display) and in ``query``, which is flagged (the handler passes it through)."""
    reply = client_for(echo).get("/a%ff?x=%FF&y=1;z&w=%zz")
    assert reply.status_code == 200
    doc = reply.json()
    assert doc["raw_path"] == "/a%ff?x=%FF&y=1;z&w=%zz" and doc["path"] == "/a\ufffd"
    assert doc["query"] == {"x": ["\ufffd"]} and doc["query_utf8"] is False


def test_a_handler_exception_is_a_500_status_without_traceback(
    client_for: ClientFor, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(req: Request, resp: Response) -> None:
        raise RuntimeError("secret-detail")

    with caplog.at_level(logging.ERROR, logger="watchcache.http"):
        reply = client_for(handler).get("/boom")
    assert reply.status_code == 500
    assert reply.content == apierrors.internal_error().body()
    assert b"secret" not in reply.content and b"Traceback" not in reply.content
    assert any(r.name.startswith("watchcache.http") and r.exc_info for r in caplog.records)


def test_a_handler_that_returns_without_answering_gives_500(client_for: ClientFor) -> None:
    async def handler(req: Request, resp: Response) -> None:
        return None

    reply = client_for(handler).get("/")
    assert reply.status_code == 500 and reply.json()["reason"] == "InternalError"


def test_a_status_error_keeps_its_code_body_and_retry_after(client_for: ClientFor) -> None:
    err = apierrors.too_many_requests("slow down", 7)

    async def handler(req: Request, resp: Response) -> None:
        if req.path == "/gone":
            raise apierrors.resource_expired("too old")
        raise err

    client = client_for(handler)
    reply = client.get("/busy")
    assert reply.status_code == 429 and reply.headers["retry-after"] == "7" and reply.content == err.body()
    reply = client.get("/gone")
    assert reply.status_code == 410 and "retry-after" not in reply.headers and reply.json()["reason"] == "Expired"


def test_a_header_value_with_a_line_break_is_refused_with_a_500_status(client_for: ClientFor) -> None:
    async def handler(req: Request, resp: Response) -> None:
        resp.send(200, b"{}", headers=[("X-Evil", "a\r\nSet-Cookie: x=1")])

    # Both protocols check the handler's header values before the answer starts (HTTP/2 used to reset the stream).
    client = client_for(handler)
    reply = client.get("/")
    assert reply.status_code == 500 and "set-cookie" not in reply.headers and "x-evil" not in reply.headers


def test_head_gets_the_length_without_the_body_and_the_connection_goes_on(client_for: ClientFor) -> None:
    async def handler(req: Request, resp: Response) -> None:
        resp.send(200, [b"0123", b"456789"], content_type="text/plain")

    client = client_for(handler)
    head = client.request("HEAD", "/h")
    assert head.status_code == 200 and head.headers["content-length"] == "10" and head.content == b""
    after = client.get("/after")  # on the same connection: it would start with the HEAD body if one had been sent
    assert after.status_code == 200 and after.content == b"0123456789"


def test_a_streamed_response_arrives_write_by_write_then_the_connection_goes_on(client_for: ClientFor) -> None:
    released = threading.Event()

    async def handler(req: Request, resp: Response) -> None:
        if req.path != "/watch":
            resp.send(200, b"{}")
            return
        resp.start_chunked(200, headers=[("X-Watch", "1")])
        resp.write_chunk([b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n'])
        resp.write_chunk([])  # nothing to send: must not end the stream
        while not released.is_set():  # the client has read the first write
            await asyncio.sleep(0.005)
        resp.write_chunk([b'{"type":"DELETED"}\n'])
        resp.end_chunked()

    client = client_for(handler)
    with client.stream("GET", "/watch") as reply:
        assert reply.status_code == 200 and reply.headers["x-watch"] == "1"
        assert "content-length" not in reply.headers
        lines = reply.iter_lines()
        assert [next(lines), next(lines)] == ['{"type":"ADDED"}', '{"type":"MODIFIED"}']
        released.set()
        assert list(lines) == ['{"type":"DELETED"}']
    assert client.get("/again").status_code == 200


def test_a_body_over_the_limit_is_413(client_for: ClientFor) -> None:
    client = client_for(echo, HttpLimits(max_body_bytes=100))
    assert client.request("POST", "/", body=b"x" * 100).status_code == 200
    reply = client.request("POST", "/", body=b"x" * 101)
    assert reply.status_code == 413 and reply.json()["reason"] == "RequestEntityTooLarge"


def test_a_header_section_over_the_limit_is_431(client_for: ClientFor) -> None:
    client = client_for(echo, HttpLimits(max_header_bytes=1024))
    assert client.get("/small").status_code == 200
    # About 1.1 KB as HTTP/1.1 lines, 1.7 KB as an HTTP/2 header list (32 bytes more per field, RFC 9113 6.5.2):
    # over the limit for both, and under the 2x at which HTTP/2 stops decoding and ends the connection
    # (an HPACK bomb, watchcache/http/h2protocol.py; tests/http/test_http2.py).
    reply = client.get("/", headers=[(f"X-H{i:02}", "v" * 60) for i in range(16)])
    assert reply.status_code == 431 and reply.json()["reason"] == "RequestHeaderFieldsTooLarge"


def test_a_client_that_leaves_mid_stream_stops_the_handler_and_runs_the_close_callbacks(
    client_for: ClientFor,
) -> None:
    state: dict[str, Any] = {}
    paused, done = threading.Event(), threading.Event()

    async def handler(req: Request, resp: Response) -> None:
        resp.add_close_callback(lambda: state.setdefault("close_callback", True))
        resp.start_chunked(200, content_type="text/plain")
        sent = 0
        while resp.writable and sent < 256 << 20:
            resp.write_chunk([b"x" * 16384])
            sent += 16384
            await asyncio.sleep(0)
        state["paused"] = not resp.writable
        paused.set()
        try:
            await resp.drain()
            state["ended"] = "drain returned"
        except ConnectionClosed:
            state["ended"] = "ConnectionClosed"  # HTTP/1.1: the handler finds out from drain()
        except asyncio.CancelledError:
            state["ended"] = "cancelled"  # HTTP/2: the stream's handler is cancelled, as Go cancels its context
            raise
        finally:
            state["closed"] = resp.closed
            done.set()

    client = client_for(handler, HttpLimits(high_water=32 * 1024, low_water=8 * 1024))
    with client.stream("GET", "/stream") as reply:
        assert reply.status_code == 200
        assert paused.wait(10) and state["paused"], "the handler never saw writable == False"
        client.close()  # the whole connection goes, mid-body
    assert done.wait(5), "the handler is still waiting after the client left"
    assert state["ended"] == ("ConnectionClosed" if client.protocol == "HTTP/1.1" else "cancelled")
    assert state["closed"] is True and state["close_callback"] is True

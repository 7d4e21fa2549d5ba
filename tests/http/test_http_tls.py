"""Over TLS, a watch chunk or a response body leaves as one SSL_write: full records, not one per buffer.

The client below does its TLS in memory (``ssl.MemoryBIO``) on a plain socket, so it sees the
records the server sealed: their count is what joining the buffers changes.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.serverthread import ServerThread
from watchcache.http.request import Request
from watchcache.http.response import Response

Serve = Callable[..., ServerThread]
APPLICATION_DATA = 23
MAX_RECORD = 16384


@pytest.fixture(scope="module")
def server_tls(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    d: Path = tmp_path_factory.mktemp("tls")
    crt, key = d / "srv.crt", d / "srv.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    return ctx


class RecordCountingClient:
    """A TLS 1.2 client (no session tickets: every application-data record is the server's data)."""

    def __init__(self, srv: ServerThread) -> None:
        self.sock = srv.connect()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing)
        self.raw = b""
        self.records: list[int] = []  # sizes of the application-data records received
        self.plain = b""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send()
                self.incoming.write(self._recv())
        self._send()

    def _send(self) -> None:
        if data := self.outgoing.read():
            self.sock.sendall(data)

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        return data

    def request(self, raw: bytes) -> None:
        self.tls.write(raw)
        self._send()

    def read_until(self, end: bytes) -> bytes:
        while end not in self.plain:
            self.raw += self._recv()
            while len(self.raw) >= 5 and len(self.raw) >= 5 + int.from_bytes(self.raw[3:5], "big"):
                size = int.from_bytes(self.raw[3:5], "big")
                record, self.raw = self.raw[: 5 + size], self.raw[5 + size :]
                if record[0] == APPLICATION_DATA:
                    self.records.append(size)
                self.incoming.write(record)
            try:
                while chunk := self.tls.read(1 << 16):
                    self.plain += chunk
            except ssl.SSLWantReadError:
                pass
        return self.plain


PARTS = [
    b'{"type":"MODIFIED","object":{"a":1}}\n',
    b'{"type":"MODIFIED","object":{"b":2}}\n',
    b"{" + b"x" * 200 + b"}\n",
]


async def watch_like(req: Request, resp: Response) -> None:
    resp.start_chunked(200)
    big = req.path == "/big"
    resp.write_chunk(PARTS * (200 if big else 1))
    resp.end_chunked()


async def list_like(req: Request, resp: Response) -> None:
    resp.send(200, [b'{"items":[', b"{", b'"a":1}', b"]}"])


def test_a_watch_chunk_of_many_buffers_is_one_record(serve: Serve, server_tls: ssl.SSLContext) -> None:
    client = RecordCountingClient(serve(watch_like, ssl=server_tls))
    client.request(b"GET /w HTTP/1.1\r\nHost: t\r\n\r\n")
    plain = client.read_until(b"\r\n0\r\n\r\n")
    body = b"".join(PARTS)
    assert b"%x\r\n%s\r\n" % (len(body), body) in plain
    # head, the chunk (size line + 3 frames + CRLF: 5 buffers), the last chunk: 3 records, not 7.
    assert len(client.records) == 3


def test_a_large_chunk_is_cut_into_full_records(serve: Serve, server_tls: ssl.SSLContext) -> None:
    client = RecordCountingClient(serve(watch_like, ssl=server_tls))
    client.request(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
    client.read_until(b"\r\n0\r\n\r\n")
    chunk = len(b"".join(PARTS)) * 200 + 10
    full = chunk // MAX_RECORD
    # The 600 frames fill records of 16 KB (give or take the cipher's overhead), not 602 small ones.
    assert len(client.records) <= 2 + full + 1
    assert sum(1 for size in client.records if size >= MAX_RECORD) == full


def test_a_response_body_of_several_buffers_is_one_record(serve: Serve, server_tls: ssl.SSLContext) -> None:
    client = RecordCountingClient(serve(list_like, ssl=server_tls))
    client.request(b"GET /l HTTP/1.1\r\nHost: t\r\n\r\n")
    plain = client.read_until(b'"a":1}]}')
    assert plain.endswith(b'{"items":[{"a":1}]}')
    assert len(client.records) == 1  # head and the 4 body buffers


def test_plain_http_still_writes_the_buffers_as_they_are(serve: Serve) -> None:
    srv = serve(watch_like)
    sock = srv.connect()
    sock.sendall(b"GET /w HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += sock.recv(1 << 16)
    assert b"".join(PARTS) in data
    sock.close()

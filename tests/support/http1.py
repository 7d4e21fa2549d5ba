"""A raw HTTP/1.1 client on a blocking socket: exact bytes out, the reply parsed strictly.

The server side is tests/support/serverthread.py; the reply parser fails on a duplicate header or a
malformed chunk, which a library client would forgive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from tests.support.serverthread import ServerThread

GET = b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


def read_reply(f: BinaryIO, *, head_only: bool = False) -> Reply:
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed before a response")
    version, code, _ = line.decode("latin-1").split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, value = line.decode("latin-1").split(":", 1)
        assert name.lower() not in headers, f"duplicate header {name}"
        headers[name.lower()] = value.strip()
    reply = Reply(int(code), headers, b"")
    if head_only:
        return reply
    if headers.get("transfer-encoding") == "chunked":
        while size := int(f.readline().strip(), 16):
            reply.chunks.append(f.read(size))
            assert f.read(2) == b"\r\n"
        assert f.readline() == b"\r\n"
        reply.body = b"".join(reply.chunks)
    else:
        reply.body = f.read(int(headers["content-length"]))
    return reply


def at_eof(f: BinaryIO) -> bool:
    try:
        return f.read(1) == b""
    except ConnectionResetError:
        return True


def exchange(srv: ServerThread, raw: bytes, *, head_only: bool = False) -> tuple[Reply, BinaryIO]:
    sock = srv.connect()
    sock.sendall(raw)
    f = sock.makefile("rb")
    sock.close()  # the file keeps the socket open
    return read_reply(f, head_only=head_only), f

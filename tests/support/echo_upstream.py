"""A tiny upstream on a real socket that answers with the header lines it received, as sent.
A request with ``If-None-Match`` gets a 304 as kube-apiserver's discovery: no body, no Content-Type,
``Cache-Control: public``; every other answer has no Cache-Control.

For pass-through tests: what the proxy forwards is read off the wire (one entry per header
line, names lower-cased, values as sent), not from a parsed mapping that would join
repeated lines. Its answers carry hop-by-hop headers of their own and a repeated header, so a
test can check what the proxy passes back.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from typing import Any

# Sent with every answer: the proxy must drop Connection, Keep-Alive and what Connection names
# (X-Hop-Response), and keep the rest, repeated lines as repeated lines.
RESPONSE_HEADERS = (
    ("Connection", "keep-alive, X-Hop-Response"),
    ("Keep-Alive", "timeout=30"),
    ("X-Hop-Response", "must-not-reach-the-client"),
    ("Warning", '299 - "first"'),
    ("Warning", '299 - "second"'),
    ("X-Upstream", "kept"),
)


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            line = self.rfile.readline(65536)
            if not line:
                return
            method, target, _ = line.decode("latin-1").split(" ", 2)
            lines: list[list[str]] = []
            while (raw := self.rfile.readline(65536)) not in (b"\r\n", b""):
                name, value = raw.decode("latin-1").split(":", 1)
                lines.append([name.strip().lower(), value.strip()])
            length = next((int(v) for n, v in lines if n == "content-length"), 0)
            body = self.rfile.read(length) if length else b""
            self.server.seen.append(lines)  # type: ignore[attr-defined]
            if any(n == "if-none-match" for n, _ in lines):  # as kube-apiserver's 304: no Content-Type
                head = [b"HTTP/1.1 304 Not Modified", b'ETag: "e1"', b"Vary: Accept", b"Cache-Control: public"]
                head += [f"{n}: {v}".encode() for n, v in RESPONSE_HEADERS]
                self.wfile.write(b"\r\n".join(head) + b"\r\n\r\n")
                self.wfile.flush()
                continue
            doc = {"method": method, "path": target, "lines": lines, "body": body.decode("latin-1")}
            payload = json.dumps(doc).encode()
            head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json", b"Content-Length: %d" % len(payload)]
            head += [f"{n}: {v}".encode() for n, v in RESPONSE_HEADERS]
            self.wfile.write(b"\r\n".join(head) + b"\r\n\r\n" + payload)
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class EchoUpstream:
    """``with EchoUpstream() as up: up.url``; ``up.seen`` holds each request's header lines."""

    def __init__(self) -> None:
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.seen = []  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def seen(self) -> list[list[list[str]]]:
        return self.server.seen  # type: ignore[attr-defined,no-any-return]

    def __enter__(self) -> EchoUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def raw_request(host: str, port: int, head: bytes, body: bytes = b"") -> tuple[int, list[tuple[str, str]], bytes]:
    """Send one request as raw bytes; (status, header lines as received, body)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(head + body)
        f = sock.makefile("rb")
        status = int(f.readline().split(b" ", 2)[1])
        lines: list[tuple[str, str]] = []
        while (raw := f.readline()) not in (b"\r\n", b""):
            name, value = raw.decode("latin-1").split(":", 1)
            lines.append((name.strip().lower(), value.strip()))
        headers = dict(lines)
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int(f.readline().strip(), 16):
                chunks.append(f.read(size))
                f.read(2)
            payload = b"".join(chunks)
        else:
            payload = f.read(int(headers.get("content-length", "0")))
        return status, lines, payload

"""A real forward proxy on 127.0.0.1 for the proxy-url tests: HTTP (``CONNECT`` and absolute-form
requests) or SOCKS5 (no authentication, CONNECT), one thread per connection, relaying bytes both ways.

It records what it was asked for (``targets``: ``(kind, host, port)``) and the ``Proxy-Authorization``
headers it saw, so a test can tell a connection went through it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from urllib.parse import urlsplit


class ForwardProxy:
    def __init__(self, kind: str = "http") -> None:
        assert kind in ("http", "socks5")
        self.kind = kind
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.targets: list[tuple[str, str, int]] = []
        self.proxy_authorization: list[str] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.kind}://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            upstream, early = self._socks5(conn) if self.kind == "socks5" else self._http(conn)
        except (OSError, ValueError):
            conn.close()
            return
        if early:
            upstream.sendall(early)
        _relay(conn, upstream)

    def _http(self, conn: socket.socket) -> tuple[socket.socket, bytes]:
        buffered = b""
        while b"\r\n\r\n" not in buffered:
            data = conn.recv(65536)
            if not data:
                raise ValueError("closed before a request head")
            buffered += data
        head, rest = buffered.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "proxy-authorization":
                self.proxy_authorization.append(value.strip())
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            self.targets.append(("CONNECT", host.strip("[]"), int(port)))
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            upstream.settimeout(None)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            return upstream, rest
        url = urlsplit(target)  # absolute form: forward with the origin form
        assert url.hostname is not None
        port = url.port or 80
        self.targets.append((method, url.hostname, port))
        upstream = socket.create_connection((url.hostname, port), timeout=10)
        upstream.settimeout(None)
        origin = url.path + (f"?{url.query}" if url.query else "")
        kept = [line for line in lines[1:] if not line.lower().startswith("proxy-")]
        new_head = "\r\n".join([f"{method} {origin} {version}", *kept]).encode("latin-1")
        return upstream, new_head + b"\r\n\r\n" + rest

    def _socks5(self, conn: socket.socket) -> tuple[socket.socket, bytes]:
        version, count = _read(conn, 2)
        if version != 5:
            raise ValueError("not SOCKS5")
        _read(conn, count)
        conn.sendall(b"\x05\x00")  # no authentication
        _, command, _, atyp = _read(conn, 4)
        if command != 1:
            raise ValueError("only CONNECT")
        if atyp == 1:
            host = socket.inet_ntoa(_read(conn, 4))
        elif atyp == 3:
            host = _read(conn, _read(conn, 1)[0]).decode()
        else:
            host = socket.inet_ntop(socket.AF_INET6, _read(conn, 16))
        (port,) = struct.unpack("!H", _read(conn, 2))
        self.targets.append(("SOCKS5", host, port))
        upstream = socket.create_connection((host, port), timeout=10)
        upstream.settimeout(None)
        conn.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("0.0.0.0") + b"\x00\x00")
        return upstream, b""


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ValueError("closed")
        data += chunk
    return data


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Both ways until both sides have ended; an EOF is passed on as one (half-close), as a TCP proxy
    does: closing a socket with unread bytes would send a reset and drop what the other side has not read."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    open_sides = 2
    try:
        while open_sides:
            for key, _ in sel.select():
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                dst: socket.socket = key.data
                data = src.recv(65536)
                if data:
                    dst.sendall(data)
                    continue
                sel.unregister(src)
                open_sides -= 1
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
    except OSError:
        return
    finally:
        with contextlib.suppress(OSError):
            a.close()
        with contextlib.suppress(OSError):
            b.close()

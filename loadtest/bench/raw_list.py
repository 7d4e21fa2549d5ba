"""The LIST ceiling: a bare uvloop server answering with ``writelines`` of pre-encoded per-item bytes.
Prints the ready line the benchmarks wait for.

Run by the benchmarks (``Helper.start("raw-list", …)`` or ``start_process``), or by hand:
``python -m loadtest.bench.raw_list --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import sys
from pathlib import Path

import uvloop

from loadtest.bench.lib import raise_nofile, server_tls


class _ListConn(asyncio.Protocol):
    """Answers GETs from ``responses``: all at once with ``writelines`` (plain), or paced (``pump``).

    Paced (the TLS ceiling): the buffers go to the transport until it is over its high-water mark,
    the rest when it resumes, as the proxy's ``send_stream`` slices a large body: the TLS layer then
    never holds (and copies) a whole 30 MB body at once.
    """

    __slots__ = ("buf", "paused", "pump", "queue", "responses", "transport")

    def __init__(self, responses: dict[bytes, list[bytes]], pump: bool = False) -> None:
        self.responses = responses
        self.buf = b""
        self.pump = pump
        self.paused = False
        self.queue: collections.deque[bytes] = collections.deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()

    def _pump(self) -> None:
        queue, write = self.queue, self.transport.write  # type: ignore[attr-defined]
        while queue and not self.paused:
            write(queue.popleft())

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            target = head.split(b" ", 2)[1]
            parts = self.responses.get(target)
            if parts is None:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")  # type: ignore[attr-defined]
                continue
            size = sum(map(len, parts))
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
                b"Content-Length: %d\r\n\r\n" % size
            )
            if self.pump:
                self.queue.append(head)
                self.queue.extend(parts)
                self._pump()
            else:
                self.transport.writelines([head, *parts])  # type: ignore[attr-defined]


async def _raw_list(args: argparse.Namespace) -> None:
    """Serves the LIST bodies in ``args.bodies`` (JSON: target -> body file) as per-item buffers."""
    import orjson

    loop = asyncio.get_running_loop()
    spec = json.loads(Path(args.bodies).read_text())
    responses: dict[bytes, list[bytes]] = {}
    for target, path in spec.items():
        body = Path(path).read_bytes()
        doc = orjson.loads(body)
        items = doc.pop("items")
        env = orjson.dumps(doc)[:-1] + b',"items":['
        parts = [env]
        sep = b"{"
        for item in items:
            parts.append(sep)
            parts.append(orjson.dumps(item)[1:])  # cached per-item bytes, as the proxy keeps them
            sep = b",{"
        parts.append(b"]}")
        if sum(map(len, parts)) != len(body):
            print(f"warning: re-encoded {target} is {sum(map(len, parts))} bytes, proxy's {len(body)}", file=sys.stderr)
        responses[target.encode()] = parts
    tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    if tls is not None and not args.no_join:
        # Over TLS each buffer is one SSL_write and at least one record: pre-join the items into
        # 64 KB buffers (full 16 KB records), the best a bare server can hand the TLS layer.
        responses = {t: regroup(parts, 64 << 10) for t, parts in responses.items()}
    pump = tls is not None and not args.no_join
    srv = await loop.create_server(lambda: _ListConn(responses, pump), "127.0.0.1", 0, backlog=4096, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    print(f"raw-list ready: listening on {'https' if tls else 'http'}://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def regroup(parts: list[bytes], size: int) -> list[bytes]:
    """``parts`` joined into buffers of at least ``size`` bytes (the last one may be shorter)."""
    out: list[bytes] = []
    group: list[bytes] = []
    n = 0
    for part in parts:
        group.append(part)
        n += len(part)
        if n >= size:
            out.append(b"".join(group))
            group, n = [], 0
    if group:
        out.append(b"".join(group))
    return out


def main(argv: list[str] | None = None) -> None:
    raise_nofile()
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.raw_list", description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", required=True)
    p.add_argument("--no-join", action="store_true", help="over TLS: writelines the per-item buffers, as plain HTTP")
    p.add_argument("--tls-cert", default="", help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", default="")
    uvloop.run(_raw_list(p.parse_args(argv)))


if __name__ == "__main__":
    main()

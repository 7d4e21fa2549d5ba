"""The load side of the LIST benchmarks: C keep-alive connections issuing LISTs (full or paged) back to
back. Driven with JSON lines over stdin/stdout (``lib.Helper``).

Run by the benchmarks (``Helper.start("list-client", …)`` or ``start_process``), or by hand:
``python -m loadtest.bench.list_client --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from typing import Any

import uvloop

from loadtest.bench.helperio import commands, emit, rusage_cpu
from loadtest.bench.lib import auth_header, client_tls, raise_nofile


class _ListClientConn(asyncio.BufferedProtocol):
    """Keep-alive LIST requests back to back; reads whole bodies, keeps only the first 4 KB."""

    def __init__(self, buf: bytearray, host: str, token: str = "") -> None:
        self.buf = buf
        self.mv = memoryview(buf)
        self.host = host
        self.auth = auth_header(token)
        self.head = bytearray()
        self.remaining = -1
        self.first = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, int]] | None = None
        self.status = 0
        self.size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def request(self, target: str) -> asyncio.Future[tuple[int, bytes, int]]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.head = bytearray()
        self.remaining = -1
        self.first = bytearray()
        self.transport.write(  # type: ignore[attr-defined]
            f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\nAccept: application/json\r\n".encode() + self.auth + b"\r\n"
        )
        return self.waiter

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.mv

    def buffer_updated(self, nbytes: int) -> None:
        data = self.mv[:nbytes]
        if self.remaining < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).lower()
            self.status = int(head.split(b" ", 2)[1])
            m = re.search(rb"content-length: *(\d+)", head)
            self.size = self.remaining = int(m.group(1)) if m else 0
            data = memoryview(bytes(self.head[end + 4 :]))
            self.head = bytearray()
        if len(self.first) < 4096:
            self.first += data[: 4096 - len(self.first)]
        self.remaining -= len(data)
        if self.remaining <= 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.status, bytes(self.first), self.size))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))


_CONTINUE = re.compile(rb'"continue":"([^"]*)"')


async def _list_run(conns: list[_ListClientConn], cmd: dict[str, Any]) -> dict[str, Any]:
    """LISTs back to back on every connection for ``duration`` s: one request, or pages until no continue."""
    from urllib.parse import quote

    first = cmd["first"]
    paged = cmd["paged"]
    page_prefix = cmd.get("page_prefix", "")
    deadline = time.monotonic() + cmd["duration"]
    req_lat: list[float] = []
    list_lat: list[float] = []
    errors: list[str] = []
    nbytes = 0
    cpu0 = rusage_cpu()

    async def worker(c: _ListClientConn) -> None:
        nonlocal nbytes
        while time.monotonic() < deadline:
            t_list = time.perf_counter()
            target = first
            while True:
                t0 = time.perf_counter()
                try:
                    status, head, size = await c.request(target)
                except ConnectionError as e:
                    errors.append(str(e))
                    return
                req_lat.append(time.perf_counter() - t0)
                nbytes += size
                if status != 200:
                    errors.append(f"{status}: {head[:200]!r}")
                    return
                if not paged:
                    break
                m = _CONTINUE.search(head)
                if not m or not m.group(1):
                    break
                target = page_prefix + quote(m.group(1).decode(), safe="")
            list_lat.append(time.perf_counter() - t_list)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    return {
        "elapsed": time.perf_counter() - t0,
        "requests": len(req_lat),
        "lists": len(list_lat),
        "bytes": nbytes,
        "req_lat": req_lat,
        "list_lat": list_lat,
        "errors": errors[:5],
        "cpu": rusage_cpu() - cpu0,
    }


async def _list_client(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    buf = bytearray(1 << 20)
    conns = []
    for _ in range(args.connections):
        _, proto = await loop.create_connection(
            lambda: _ListClientConn(buf, f"{args.host}:{args.port}", args.token),
            args.host,
            args.port,
            ssl=client_tls() if args.tls else None,
        )
        conns.append(proto)
    emit({"event": "connected", "connections": len(conns)})
    async for cmd in commands():
        emit(await _list_run(conns, cmd))
    for c in conns:
        c.transport.close()


def main(argv: list[str] | None = None) -> None:
    raise_nofile()
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.list_client", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--token", default="")
    uvloop.run(_list_client(p.parse_args(argv)))


if __name__ == "__main__":
    main()

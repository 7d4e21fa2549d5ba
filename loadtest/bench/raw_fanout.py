"""The fan-out ceiling: a bare uvloop server writing pre-built pod watch frames to every connection,
coalesced into one chunk per connection per loop pass. Prints the ready line the benchmarks wait for.

Run by the benchmarks (``Helper.start("raw-fanout", …)`` or ``start_process``), or by hand:
``python -m loadtest.bench.raw_fanout --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import uvloop

from loadtest.bench.lib import STAMP_KEY, STAMP_MARK, raise_nofile, server_tls


class _FanoutConn(asyncio.Protocol):
    __slots__ = ("paused", "pending", "pending_bytes", "req", "server", "transport")

    def __init__(self, server: _FanoutServer) -> None:
        self.server = server
        self.req = b""
        self.paused = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=256 * 1024, low=64 * 1024)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.req is None:
            return
        self.req += data
        if b"\r\n\r\n" not in self.req:
            return
        target = self.req.split(b" ", 2)[1]
        self.req = None  # type: ignore[assignment]
        if target.startswith(b"/control"):
            # /control?rate=R&stamp=S: (re)start generating at R events/s (0: stop); answers the counters.
            from urllib.parse import parse_qs, urlsplit

            q = parse_qs(urlsplit(target.decode()).query)
            if "rate" in q:
                self.server.set_rate(float(q["rate"][0]), float(q.get("stamp", ["0"])[0]))
            body = json.dumps(self.server.stats()).encode()
            self.transport.write(  # type: ignore[attr-defined]
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            self.transport.close()
            return
        self.transport.write(  # type: ignore[attr-defined]
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        self.server.conns.add(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.pending:
            self.server.flush_one(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)


class _FanoutServer:
    """Generates ``rate`` events/s in 10 ms ticks; each tick's frames go to each connection as ONE chunk.

    Idle until ``/control?rate=R`` (so watchers connect without load, as in the other variants).
    """

    def __init__(self, template: bytes, cap: int, join: bool = False) -> None:
        self.conns: set[_FanoutConn] = set()
        # Over TLS: each buffer handed to the transport becomes at least one TLS record (and one
        # SSL_write); a chunk's size line and CRLF would be records of a few bytes. Joined, the
        # chunk is one buffer the TLS layer cuts into full 16 KB records.
        self.join = join
        self.rate = 0.0
        self.stamp_every = 0.0
        self.cap = cap
        # A pod frame with a fixed-width stamp slot; unstamped frames carry a same-width filler key.
        obj = template
        marker = b'"' + STAMP_KEY.encode() + b'":"0000000000.000000"'
        if marker not in obj:
            raise SystemExit("template lacks the stamp annotation")
        head = b'{"type":"MODIFIED","object":'
        i = obj.index(marker) + len(STAMP_MARK)
        self.pre = head + obj[:i]
        self.post = obj[i + len("0000000000.000000") :] + b"}\n"
        self.plain = head + obj.replace(marker, b'"bench/written-xx":"0000000000.000000"') + b"}\n"
        self.frame_bytes = len(self.plain)
        self.generated = 0
        self.stamped = 0
        self.dropped = 0
        self.writes = 0
        self._last_stamp = 0.0
        self._wake = asyncio.Event()

    def set_rate(self, rate: float, stamp_rate: float) -> None:
        self.rate = rate
        self.stamp_every = 1.0 / stamp_rate if stamp_rate > 0 else 0.0
        self._wake.set()

    def stats(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "generated": self.generated,
            "stamped": self.stamped,
            "dropped": self.dropped,
            "writes": self.writes,
            "connections": len(self.conns),
            "frame_bytes": self.frame_bytes,
        }

    def _frames(self, n: int, due_at: list[float]) -> list[bytes]:
        """``n`` frames; ``due_at[i]``: when frame i was due (wall clock), the time a stamp carries.

        Stamping the due time, not the time the loop got round to building the frame, makes the
        ceiling's latency include its own queueing, as the proxy's does (its stamps are set by the
        writer before the upstream even sees the event).
        """
        frames = []
        for due in due_at:
            if self.stamp_every and due - self._last_stamp >= self.stamp_every:
                self._last_stamp = due
                frames.append(self.pre + b"%.6f" % due + self.post)  # built once, shared by all connections
                self.stamped += 1
            else:
                frames.append(self.plain)
        self.generated += n
        return frames

    def flush_one(self, c: _FanoutConn) -> None:
        parts = c.pending
        c.pending = []
        c.pending_bytes = 0
        self._write(c, parts)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.rate <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            rate = self.rate
            start = loop.time()
            wall_start = time.time()
            done = 0
            while self.rate == rate:
                due = int((loop.time() - start) * rate) - done
                limit = max(1, int(rate))
                if due > limit:  # as the sim's churn: more than a second behind is dropped, not replayed
                    done += due - limit
                    due = limit
                if due > 0:
                    due_at = [wall_start + (done + i + 1) / rate for i in range(due)]
                    done += due
                    self._send(self._frames(due, due_at))
                await asyncio.sleep(0.01)

    def _send(self, frames: list[bytes]) -> None:
        size = sum(map(len, frames))
        for c in self.conns:
            if c.paused:
                if c.pending_bytes + size > self.cap:
                    self.dropped += len(frames)
                    continue
                c.pending.extend(frames)
                c.pending_bytes += size
                continue
            if c.pending:
                c.pending.extend(frames)
                self.flush_one(c)
            else:
                self._write(c, frames)

    def _write(self, c: _FanoutConn, parts: list[bytes]) -> None:
        chunk = [b"%x\r\n" % sum(map(len, parts)), *parts, b"\r\n"]
        if self.join:
            c.transport.write(b"".join(chunk))  # type: ignore[attr-defined]
        else:
            c.transport.writelines(chunk)  # type: ignore[attr-defined]
        self.writes += 1


async def _raw_fanout(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    template = Path(args.template).read_bytes()
    tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    server = _FanoutServer(template, args.cap, join=tls is not None and not args.no_join)
    srv = await loop.create_server(lambda: _FanoutConn(server), "127.0.0.1", 0, backlog=4096, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    gen = asyncio.ensure_future(server.run())
    print(f"raw-fanout ready: listening on {'https' if tls else 'http'}://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    gen.cancel()
    print(json.dumps(server.stats()), flush=True)


def main(argv: list[str] | None = None) -> None:
    raise_nofile()
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.raw_fanout", description=__doc__.split("\n\n")[0])
    p.add_argument("--template", required=True)
    p.add_argument("--cap", type=int, default=16 << 20)
    p.add_argument("--no-join", action="store_true", help="over TLS: writelines the chunk's parts, as plain HTTP")
    p.add_argument("--tls-cert", default="", help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", default="")
    uvloop.run(_raw_fanout(p.parse_args(argv)))


if __name__ == "__main__":
    main()

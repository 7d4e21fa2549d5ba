"""The load side of the fan-out benchmark: N watch connections on raw sockets (uvloop ``BufferedProtocol``,
one shared 256 KB receive buffer), counting frames (``}\\n``) and parsing only the ``bench/written-at``
stamps on a sample of the connections. Driven with JSON lines over stdin/stdout (``lib.Helper``).

Run by the benchmarks (``Helper.start("watch-reader", …)`` or ``start_process``), or by hand:
``python -m loadtest.bench.watch_reader --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import time

import uvloop

from loadtest.bench.helperio import commands, emit, rusage_cpu
from loadtest.bench.lib import STAMP_MARK, auth_header, client_tls, raise_nofile


class _ReaderState:
    def __init__(self, sample_every: int) -> None:
        self.buf = bytearray(256 * 1024)
        self.mv = memoryview(self.buf)
        self.frames = 0
        self.framing = 0
        self.bytes = 0
        self.established = 0
        self.failed = 0
        self.closed = 0
        self.sample_every = sample_every
        self.lat_since: float | None = None
        self.latencies: list[float] = []
        self.by_label: dict[str, list[float]] = {}
        self.bad_status: list[str] = []


class _WatchConn(asyncio.BufferedProtocol):
    """One watch: count frames (``}\\n``), optionally parse stamps. Nothing else is parsed."""

    __slots__ = (
        "carry",
        "done",
        "frames",
        "head",
        "label",
        "last",
        "probe_request",
        "probing",
        "request",
        "sampled",
        "st",
        "transport",
    )

    def __init__(
        self,
        st: _ReaderState,
        request: bytes,
        sampled: bool,
        done: asyncio.Future[bool],
        probe: bool = False,
        probe_request: bytes = b"GET /debug/shards HTTP/1.1\r\nHost: bench\r\n\r\n",
    ) -> None:
        self.st = st
        self.request = request
        self.probe_request = probe_request
        self.sampled = sampled
        self.done = done
        self.head: bytearray | None = bytearray()
        self.frames = 0
        self.last = 0
        self.carry = b""
        # A sharded proxy: ask which worker holds this connection (keep-alive keeps it there).
        self.probing = probe
        self.label = "-"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.probing:
            transport.write(self.probe_request)  # type: ignore[attr-defined]
        else:
            transport.write(self.request)  # type: ignore[attr-defined]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.st.mv

    def _probe_answer(self) -> None:
        assert self.head is not None
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.head[:end])
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if m:
            size = int(m.group(1))
            if len(self.head) < end + 4 + size:
                return
            body = bytes(self.head[end + 4 : end + 4 + size])
        else:  # chunked (e.g. passed through to the upstream): wait for the last chunk
            tail = self.head.find(b"\r\n0\r\n\r\n", end)
            if tail < 0:
                return
            body = bytes(self.head[end + 4 : tail])
        w = re.search(rb'"worker":\s*(\d+)', body)
        self.label = f"worker {w.group(1).decode()}" if w else "-"
        self.probing = False
        self.head = bytearray()
        self.transport.write(self.request)  # type: ignore[attr-defined]

    def buffer_updated(self, nbytes: int) -> None:
        st = self.st
        if self.probing:
            assert self.head is not None
            self.head += st.buf[:nbytes]
            self._probe_answer()
            return
        if self.head is not None:
            self.head += st.buf[:nbytes]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self.head[: self.head.find(b"\r\n")])
            rest = bytes(self.head[end + 4 :])
            self.head = None
            if b" 200 " not in status:
                st.bad_status.append(status.decode(errors="replace"))
                st.failed += 1
                if not self.done.done():
                    self.done.set_result(False)
                self.transport.close()
                return
            st.established += 1
            if not self.done.done():
                self.done.set_result(True)
            if rest:
                self._body(rest, len(rest))
            return
        self._body(st.buf, nbytes)

    def _body(self, data: bytes | bytearray, n: int) -> None:
        st = self.st
        # Every frame ends with "}\n"; the chunked framing's newlines follow "\r" or a hex digit.
        # A find() loop (memchr) is ~9 GB/s here; bytes.count(b"}\n") only 0.5 GB/s.
        c = o = 0
        find = data.find
        i = find(b"\n", 0, n)
        while i != -1:
            if (data[i - 1] if i else self.last) == 125:
                c += 1
            else:
                o += 1  # chunk framing: 2 per chunk, i.e. per write of the server
            i = find(b"\n", i + 1, n)
        self.last = data[n - 1]
        self.frames += c
        st.frames += c
        st.framing += o
        st.bytes += n
        if self.sampled and st.lat_since is not None:
            now = time.time()
            carry = self.carry
            combined = carry + bytes(data[:n])
            i = combined.find(STAMP_MARK)
            while i != -1:
                start = i + len(STAMP_MARK)
                j = combined.find(b'"', start)
                if j == -1:
                    break
                if j >= len(carry):  # not already seen complete in the previous read
                    stamp = float(combined[start:j])
                    if stamp >= st.lat_since:
                        st.latencies.append(now - stamp)
                        st.by_label.setdefault(self.label, []).append(now - stamp)
                i = combined.find(STAMP_MARK, j)
            self.carry = combined[-64:]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head is None:
            self.st.closed += 1
        elif not self.done.done():
            self.st.failed += 1
            self.done.set_result(False)


async def _watch_reader(args: argparse.Namespace) -> None:
    import uvloop  # noqa: F401  (the loop policy is set in main)

    loop = asyncio.get_running_loop()
    st = _ReaderState(args.sample_every)
    request = (
        (
            f"GET {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\nAccept: application/json\r\n"
            "User-Agent: watchcache-bench\r\n"
        ).encode()
        + auth_header(args.token)
        + b"\r\n"
    )
    probe_request = b"GET /debug/shards HTTP/1.1\r\nHost: bench\r\n" + auth_header(args.probe_token) + b"\r\n"
    tls = client_tls() if args.tls else None
    conns: list[_WatchConn] = []
    sem = asyncio.Semaphore(args.connect_concurrency)

    async def one(i: int) -> None:
        async with sem:
            done: asyncio.Future[bool] = loop.create_future()
            sampled = args.sample_every > 0 and (i + args.offset) % args.sample_every == 0
            probe = sampled and args.probe_worker
            try:
                _, proto = await loop.create_connection(
                    lambda: _WatchConn(st, request, sampled, done, probe, probe_request), args.host, args.port, ssl=tls
                )
            except OSError as e:
                st.failed += 1
                st.bad_status.append(f"connect: {e}")
                return
            conns.append(proto)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), 60)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.connections)))
    emit(
        {
            "event": "connected",
            "established": st.established,
            "failed": st.failed,
            "seconds": round(time.monotonic() - started, 3),
            "errors": st.bad_status[:5],
        }
    )
    async for cmd in commands():
        what = cmd["cmd"]
        if what == "snap":
            # Per watch: the fewest and most frames any established connection has read (the benchmarks'
            # exact check: every watch got every event once).
            counts = [c.frames for c in conns if c.head is None] or [0]
            emit(
                {
                    "t": time.time(),
                    "frames": st.frames,
                    "chunks": st.framing // 2,
                    "bytes": st.bytes,
                    "closed": st.closed,
                    "established": st.established,
                    "conn_frames_min": min(counts),
                    "conn_frames_max": max(counts),
                    "cpu": rusage_cpu(),
                }
            )
        elif what == "lat-start":
            st.latencies = []
            st.by_label = {}
            st.lat_since = float(cmd["since"])
            emit({"ok": True})
        elif what == "lat-stop":
            st.lat_since = None
            emit({"latencies": st.latencies, "by_label": st.by_label})
            st.latencies = []
            st.by_label = {}
    for c in conns:
        with contextlib.suppress(Exception):
            c.transport.abort()  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    raise_nofile()
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.watch_reader", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--sample-every", type=int, default=0, help="parse stamps on every Nth connection (0: none)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--connect-concurrency", type=int, default=100)
    p.add_argument(
        "--probe-worker", action="store_true", help="sampled connections ask /debug/shards which worker serves them"
    )
    p.add_argument("--tls", action="store_true", help="connect with TLS (no verification)")
    p.add_argument("--token", default="", help="bearer token of the watch requests")
    p.add_argument("--probe-token", default="", help="bearer token of the /debug/shards probes")
    uvloop.run(_watch_reader(p.parse_args(argv)))


if __name__ == "__main__":
    main()

"""A throttling TCP relay for the chaos campaign and the tiers test: proxy → relay → upstream, with a slowness toggle.

``python -m harness.relay --listen 127.0.0.1:0 --target 127.0.0.1:8081`` forwards every
connection to the target, byte for byte. A control endpoint (``--control``, HTTP) changes how:

    POST /config {"latency": 0.1, "jitter": 0.02, "bandwidth": 1000000}   # seconds, seconds, bytes/s
    POST /config {}                                                         # back to a clean wire
    GET  /config                                                            # current settings and counters

``latency`` delays every chunk in each direction (order kept), ``bandwidth`` caps each direction
of each connection (0: unlimited), ``split`` (bytes, 0: off) writes each chunk in pieces of at most
that size ``split_pause`` seconds apart (default 2 ms), so that the receiver reads them
separately (a watch stream's lines, and groups of lines, then straddle network reads). Settings apply to chunks
read after the change, on existing connections too. Backpressure is kept: a bounded queue per
direction, and writes are drained, so a throttled watch stream fills the upstream's buffers as a
slow network would.

With ``fallbacks`` (in process: ``Relay(host, port, fallbacks=[(host, port), ...])``) it is a TCP load
balancer with a preferred backend: each new connection goes to the first target that accepts it, so
while the first is down (refuses connections) they go to the next; connections already open stay
where they are (TLS passes through untouched). ``dialed`` counts the connections made to each target;
targets in ``out`` are skipped (what a health check has taken out of rotation, e.g. an apiserver not
ready yet although it already accepts connections).

Prints ``relay ready: listening on http://H:P control http://H:C`` once it accepts connections.
Loopback only by intent (the campaign binds 127.0.0.1); every queue and wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

CHUNK = 64 << 10
QUEUE_CHUNKS = 64
# Between the pieces of a split chunk: long enough for the receiver to read each on its own.
SPLIT_PAUSE = 0.002


@dataclass
class Settings:
    latency: float = 0.0
    jitter: float = 0.0
    bandwidth: int = 0
    split: int = 0
    split_pause: float = SPLIT_PAUSE


@dataclass
class Counters:
    connections: int = 0
    open: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class Relay:
    def __init__(self, target_host: str, target_port: int, *, fallbacks: Sequence[tuple[str, int]] = ()) -> None:
        self.target = (target_host, target_port)  # may be switched while running (a Service's endpoint moving)
        self.fallbacks = list(fallbacks)
        self.dialed: dict[tuple[str, int], int] = {t: 0 for t in self.targets}
        self.out: set[tuple[str, int]] = set()  # not dialed (taken out by a health check)
        self.settings = Settings()
        self.counters = Counters()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def targets(self) -> list[tuple[str, int]]:
        """Tried in order for each new connection: the first that accepts it gets it."""
        return [self.target, *self.fallbacks]

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        # Let each connection's handler see its pipes end (else the loop's end cancels them mid-wait,
        # and asyncio logs every one).
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5.0)

    def configure(self, spec: dict[str, float]) -> None:
        self.settings = Settings(
            latency=max(0.0, float(spec.get("latency", 0.0))),
            jitter=max(0.0, float(spec.get("jitter", 0.0))),
            bandwidth=max(0, int(spec.get("bandwidth", 0))),
            split=max(0, int(spec.get("split", 0))),
            split_pause=max(0.0, float(spec.get("split_pause", SPLIT_PAUSE))),
        )

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        self.counters.open += 1
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
        try:
            up = await self._dial()
            if up is None:
                return  # every upstream is down: the client sees its connection closed
            up_reader, up_writer = up
            tasks = [
                asyncio.ensure_future(self._pipe(reader, up_writer, up=True)),
                asyncio.ensure_future(self._pipe(up_reader, writer, up=False)),
            ]
            for t in tasks:
                self._tasks.add(t)
            try:
                # Either side ending ends both (a half-closed HTTP connection is of no use here).
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                    self._tasks.discard(t)
                up_writer.close()
        finally:
            self.counters.open -= 1
            if me is not None:
                self._handlers.discard(me)
            writer.close()

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for target in self.targets:
            if target in self.out:
                continue
            try:
                up = await asyncio.wait_for(asyncio.open_connection(*target), 5.0)
            except (OSError, TimeoutError):
                continue
            self.dialed[target] = self.dialed.get(target, 0) + 1
            return up
        return None

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, up: bool) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.ensure_future(self._send(queue, dst, up=up))
        last_due = 0.0
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                s = self.settings
                delay = s.latency + (random.uniform(0, s.jitter) if s.jitter else 0.0)
                due = max(last_due, time.monotonic() + delay)  # never reorder
                last_due = due
                await queue.put((due, data))
            await queue.put(None)
            await sender
        finally:
            sender.cancel()

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter, *, up: bool
    ) -> None:
        while True:
            item = await queue.get()
            if item is None:
                with contextlib.suppress(OSError):
                    await dst.drain()
                return
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, 10.0))
            split = self.settings.split
            if split:
                for i in range(0, len(data), split):
                    if i:
                        await asyncio.sleep(self.settings.split_pause)
                    dst.write(data[i : i + split])
                    await dst.drain()
            else:
                dst.write(data)
                await dst.drain()
            if up:
                self.counters.bytes_up += len(data)
            else:
                self.counters.bytes_down += len(data)
            bandwidth = self.settings.bandwidth
            if bandwidth:
                await asyncio.sleep(min(len(data) / bandwidth, 10.0))


async def _control(relay: Relay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal HTTP/1.0 endpoint: GET or POST /config."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for h in lines[1:]:
            name, _, value = h.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await asyncio.wait_for(reader.readexactly(length), 5.0) if length else b""
        status = "200 OK"
        payload: dict[str, Any]
        if path != "/config":
            status, payload = "404 Not Found", {"error": "not found"}
        else:
            if method == "POST":
                relay.configure(json.loads(body or b"{}"))
            payload = {"settings": asdict(relay.settings), "counters": asdict(relay.counters)}
        data = json.dumps(payload).encode()
        writer.write(
            f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
    except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError):
        pass
    finally:
        writer.close()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def main_async(args: argparse.Namespace) -> None:
    relay = Relay(*_host_port(args.target))
    host, port = _host_port(args.listen)
    bound = await relay.start(host, port)
    chost, cport = _host_port(args.control)
    control = await asyncio.start_server(lambda r, w: _control(relay, r, w), chost, cport)
    cbound = control.sockets[0].getsockname()[1]
    print(f"relay ready: listening on http://{host}:{bound} control http://{chost}:{cbound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    control.close()
    await relay.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--target", required=True, help="HOST:PORT to forward to")
    p.add_argument("--control", default="127.0.0.1:0", help="HOST:PORT of the control endpoint")
    args = p.parse_args(argv)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Slow readers: clients that ask for LISTs and never read them, while others keep asking.

One ``watchcache sim`` (``--objects`` pods: a LIST of them is larger than every buffer on the
way) and one ``watchcache serve --http2 --workers 1`` over TLS in front of it, with a small
``--max-requests-inflight`` so that the hostile clients could take every slot:

* ``--h1`` HTTP/1.1 connections, each asking for the LIST of every pod with a 4 KB receive
  buffer and never reading;
* ``--h2`` HTTP/2 connections that advertise ``SETTINGS_INITIAL_WINDOW_SIZE=0`` and open
  ``--streams`` LISTs each (no byte of any answer may be sent to them);
* meanwhile ``--good`` well-behaved clients GET one pod in a loop (keep-alive, HTTP/1.1), and
  every second the figures are printed: their answers by code, their p50/p99 latency, the
  proxy's in-flight requests and RSS.

Without a request deadline (``--request-timeout 0``) the good clients get 429 for as long as the
hostile connections stay open; with kube's (60 s; the run's default is 10 s to keep it short)
they are served again within the deadline, and the hostile connections are closed.

Run: ``.venv/bin/python -m loadtest.bench.slow_readers`` (~1 min), and
``--request-timeout 0`` for the before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import statistics
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.settings

from loadtest.bench import lib as bl

LIST = "/api/v1/pods"
_readers: set[asyncio.Future[None]] = set()  # the hostile HTTP/2 connections' frame readers
GET = "/api/v1/namespaces/ns-0/pods?limit=1"


def client_ctx(alpn: str) -> ssl.SSLContext:
    ctx = bl.client_tls()
    ctx.set_alpn_protocols([alpn])
    return ctx


async def hostile_h1(host: str, port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` HTTP/1.1 connections, each with a LIST it never reads (a 4 KB receive buffer)."""
    writers = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        _, writer = await asyncio.open_connection(sock=sock, ssl=client_ctx("http/1.1"), server_hostname=host)
        writer.transport.pause_reading()  # type: ignore[attr-defined]
        writer.write(f"GET {LIST} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        writers.append(writer)
    return writers


async def hostile_h2(host: str, port: int, count: int, streams: int) -> list[asyncio.StreamWriter]:
    """``count`` HTTP/2 connections with INITIAL_WINDOW_SIZE=0, ``streams`` LISTs each; reads
    frames (so the socket is not what stops the server) but never opens a stream's window."""
    writers = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, port, ssl=client_ctx("h2"), server_hostname=host)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        fields = [(":method", "GET"), (":scheme", "https"), (":authority", host), (":path", LIST)]
        for _ in range(streams):
            conn.send_headers(conn.get_next_available_stream_id(), fields, end_stream=True)
        writer.write(conn.data_to_send())

        async def drain(reader: asyncio.StreamReader = reader) -> None:
            while await reader.read(65536):  # frames read, windows never opened
                pass

        _readers.add(asyncio.ensure_future(drain()))
        writers.append(writer)
    return writers


class Good:
    """One well-behaved client: GET one pod in a loop on a keep-alive connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.codes: list[tuple[float, int, float]] = []  # (when, code, seconds)

    async def run(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        reader = writer = None
        while loop.time() < until:
            start = loop.time()
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port, ssl=client_ctx("http/1.1")), 5
                    )
                assert reader is not None and writer is not None
                writer.write(f"GET {GET} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                code = int(head.split(b" ", 2)[1])
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                if b"connection: close" in head.lower():
                    writer.close()
                    writer = None
            except (OSError, TimeoutError, asyncio.IncompleteReadError, StopIteration, ValueError):
                code = 0
                if writer is not None:
                    writer.close()
                writer = None
            self.codes.append((start, code, loop.time() - start))
            if code != 200:
                await asyncio.sleep(0.05)


def scrape(proxy: bl.Proc) -> dict[str, float]:
    ctx = bl.client_tls()
    with urllib.request.urlopen(proxy.url + "/metrics", context=ctx, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_current_inflight_requests") or line.startswith(
            "watchcache_rejected_requests_total"
        ):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def scenario(proxy: bl.Proc, args: argparse.Namespace) -> dict[str, Any]:
    host, port = proxy.address
    loop = asyncio.get_running_loop()
    start = loop.time()
    goods = [Good(host, port) for _ in range(args.good)]
    until = start + args.duration
    tasks = [asyncio.ensure_future(g.run(until)) for g in goods]
    await asyncio.sleep(1.0)  # the good clients alone first
    attack = loop.time()
    hostile = await hostile_h1(host, port, args.h1) + await hostile_h2(host, port, args.h2, args.streams)
    rows = []
    while loop.time() < until:
        await asyncio.sleep(1.0)
        now = loop.time()
        window = [c for g in goods for c in g.codes if now - 1.0 <= c[0] < now]
        ok = [c[2] for c in window if c[1] == 200]
        metrics = await loop.run_in_executor(None, scrape, proxy)
        inflight = sum(v for k, v in metrics.items() if k.startswith("apiserver_current_inflight_requests"))
        row = {
            "t": round(now - attack, 1),
            "ok": len(ok),
            "429": sum(1 for c in window if c[1] == 429),
            "other": sum(1 for c in window if c[1] not in (200, 429)),
            "p50_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
            "p99_ms": round(sorted(ok)[int(len(ok) * 0.99) - 1 if len(ok) > 1 else 0] * 1000, 1) if ok else None,
            "inflight": inflight,
            "rss_mb": round(proxy.rss() / 1e6),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    await asyncio.gather(*tasks)
    for w in hostile:
        w.close()
    after = [c for g in goods for c in g.codes if c[0] >= attack]
    refused = [c[0] - attack for c in after if c[1] == 429]
    rejected = {k: v for k, v in scrape(proxy).items() if "rejected" in k and v}
    return {
        "served_during_attack": sum(1 for c in after if c[1] == 200),
        "refused_during_attack": sum(1 for c in after if c[1] == 429),
        "last_429_after_attack_s": round(max(refused), 1) if refused else None,
        "rejected": rejected,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=20_000, help="pods in the sim (the LIST's size)")
    p.add_argument("--inflight", type=int, default=40, help="the proxy's --max-requests-inflight")
    p.add_argument("--request-timeout", type=float, default=10.0, help="the proxy's --request-timeout (0: none)")
    p.add_argument("--h1", type=int, default=20, help="HTTP/1.1 connections that never read")
    p.add_argument("--h2", type=int, default=1, help="HTTP/2 connections with INITIAL_WINDOW_SIZE=0")
    p.add_argument("--streams", type=int, default=50, help="LIST streams per HTTP/2 connection")
    p.add_argument("--good", type=int, default=4, help="well-behaved clients")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of the whole run")
    args = p.parse_args()
    bl.raise_nofile()
    directory = Path(tempfile.mkdtemp(prefix="bench-slow-readers-"))
    crt, key = bl.make_tls_cert(directory)
    sim = proxy = None
    try:
        sim = bl.start_sim(objects=args.objects, namespaces=10)
        proxy = bl.start_proxy(
            sim.url,
            extra=[
                "--workers", "1", "--http2", "--tls-cert-file", str(crt), "--tls-private-key-file", str(key),
                "--max-requests-inflight", str(args.inflight), "--request-timeout", str(args.request_timeout),
            ],
        )  # fmt: skip
        print(json.dumps({"machine": bl.machine_info(), "args": vars(args)}), flush=True)
        result = asyncio.run(scenario(proxy, args))
        result.pop("rows")
        print(json.dumps(result), flush=True)
    finally:
        bl.stop_all([proxy, sim])


if __name__ == "__main__":
    main()

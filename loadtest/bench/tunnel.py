"""Connection-upgrade tunnels (kubectl exec/cp/port-forward): throughput and memory of one tunnel.

Topology: client (this process, blocking sockets) -> ``watchcache serve`` -> a raw upstream (a
separate process started as ``python -m loadtest.bench.tunnel upstream``) that answers every
upgrade with ``101`` and then floods N bytes (``/flood?bytes=N``) or swallows what it gets
(``/sink``, answering ``done:<bytes>`` at EOF). The same transfers straight to the upstream
give the baseline. Measured: MB/s each way, the proxy's CPU seconds per GB relayed, and its
peak RSS growth (sampled every 50 ms) — flow control must keep it near two write buffers.

Run: ``.venv/bin/python -m loadtest.bench.tunnel --quick`` (256 MB each way) or without (1 GiB).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from urllib.parse import parse_qs, urlsplit

from loadtest.bench import lib as bl

MB = 1 << 20
_101 = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"


# ---------------------------------------------------------------- the upstream role


async def _upstream_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    target = head.split(b" ", 2)[1].decode()
    url = urlsplit(target)
    if url.path == "/flood":
        writer.write(_101)
        remaining = int(parse_qs(url.query)["bytes"][0])
        block = b"\xa5" * (256 * 1024)
        while remaining > 0:
            part = block[: min(len(block), remaining)]
            writer.write(part)
            await writer.drain()
            remaining -= len(part)
    elif url.path == "/sink":
        writer.write(_101)
        received = 0
        while data := await reader.read(1 << 20):
            received += len(data)
        writer.write(b"done:%d" % received)
        await writer.drain()
    else:
        body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}'
        writer.write(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        writer.write(body)
    await writer.drain()
    writer.close()


async def _upstream_main() -> None:
    server = await asyncio.start_server(_upstream_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"bench upstream ready: listening on http://127.0.0.1:{port}", flush=True)
    await server.serve_forever()


# ---------------------------------------------------------------- the client side


def _upgrade(url: str, path: str) -> tuple[socket.socket, bytes]:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock, rest


class Sampler:
    """Peak RSS of a process tree, sampled every 50 ms while a transfer runs."""

    def __init__(self, proc: bl.Proc | None) -> None:
        self.proc = proc
        self.base = proc.rss() if proc else 0
        self.peak = self.base
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self.proc is not None and not self.stop.wait(0.05):
            self.peak = max(self.peak, self.proc.rss())

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def download(url: str, size: int) -> float:
    sock, rest = _upgrade(url, f"/flood?bytes={size}")
    received = len(rest)
    started = time.perf_counter()
    buf = bytearray(1 << 20)
    while received < size:
        n = sock.recv_into(buf)
        if not n:
            raise RuntimeError(f"closed after {received} of {size} bytes")
        received += n
    elapsed = time.perf_counter() - started
    sock.close()
    return elapsed


def upload(url: str, size: int) -> float:
    sock, _ = _upgrade(url, "/sink")
    block = b"\x5a" * MB
    started = time.perf_counter()
    sent = 0
    while sent < size:
        sock.sendall(block[: min(len(block), size - sent)])
        sent += min(len(block), size - sent)
    sock.shutdown(socket.SHUT_WR)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    elapsed = time.perf_counter() - started
    assert answer == b"done:%d" % size, answer
    sock.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "upstream"])
    parser.add_argument("--quick", action="store_true", help="256 MB each way instead of 1 GiB")
    args = parser.parse_args()
    if args.role == "upstream":
        asyncio.run(_upstream_main())
        return
    size = 256 * MB if args.quick else 1024 * MB
    machine = bl.machine_info()
    upstream = bl.start_process("upstream", bl.python_m("loadtest.bench.tunnel", "upstream"))
    proxy = None
    try:
        # Not bl.start_proxy: it waits for /readyz, and a proxy caching nothing is never "ready".
        serve = ["serve", "--listen", "127.0.0.1:0", "--upstream", upstream.url, "--workers", "1"]
        proxy = bl.start_process("proxy", [*bl.watchcache_exe(), *serve])
        rows = []
        results: dict[str, dict[str, float]] = {}
        for label, url, proc in (("direct", upstream.url, None), ("through watchcache", proxy.url, proxy)):
            for direction, fn in (("upstream->client", download), ("client->upstream", upload)):
                cpu0 = proc.cpu() if proc else 0.0
                with Sampler(proc) as sampler:
                    elapsed = fn(url, size)
                cpu = (proc.cpu() - cpu0) if proc else 0.0
                mbps = size / MB / elapsed
                growth = (sampler.peak - sampler.base) / MB
                key = f"{label} {direction}"
                results[key] = {"mb_per_s": mbps, "cpu_s_per_gb": cpu / (size / (1024 * MB)), "peak_rss_mb": growth}
                rows.append([label, direction, f"{mbps:.0f}", f"{cpu / (size / (1024 * MB)):.2f}" if proc else "-",
                             f"{growth:.1f}" if proc else "-"])  # fmt: skip
        bl.print_table(
            ["path", "direction", "MB/s", "proxy CPU s/GB", "proxy peak RSS growth MB"],
            rows,
            title=f"one tunnel, {size // MB} MB each way, {machine['cores']} cores, load {machine['loadavg_at_start']}",
        )
        bl.bench_line("tunnel", {"bytes": size, "machine": machine, "results": results})
    finally:
        bl.stop_all([proxy, upstream])


if __name__ == "__main__":
    main()

"""The per-operation costs the design rests on (docs/lab/performance-notebook.md, "Design figures").

One process, no server: encoding and decoding a 4 KB pod (orjson vs the stdlib), a LIST body
joined from cached bytes vs re-encoded, prometheus-client operations vs a plain integer, and
the cost of a socket write per event vs one write per watcher for everything pending (uvloop,
a unix socket pair drained by a reader process). Medians of ``--repeat`` runs; pin it to one
core (``taskset -c 1``) and keep the machine quiet, and compare ratios rather than absolutes.

    .venv/bin/python -m loadtest.bench.micro            # ~30 s
    .venv/bin/python -m loadtest.bench.micro --quick    # ~5 s, fewer repeats
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson
import uvloop
from prometheus_client import CollectorRegistry, Counter, Histogram

from watchcache.cache.object import encode_object
from watchcache.resources import PODS


def pod(i: int) -> dict[str, Any]:
    """A pod of about 4 KB of JSON, like the simulated cluster's."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"web-{i:05d}",
            "namespace": "ns-1",
            "uid": f"{i:08x}-0000-4000-8000-000000000000",
            "resourceVersion": str(1000 + i),
            "labels": {"app": "web", "tier": "frontend", "pod-template-hash": "5d8f7c9b6d"},
            "annotations": {"note": "x" * 1200},
        },
        "spec": {
            "nodeName": "node-3",
            "containers": [
                {
                    "name": f"c{j}",
                    "image": "registry.example/web:1.2.3",
                    "env": [{"name": f"VAR_{k}", "value": "v" * 20} for k in range(10)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
                for j in range(3)
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def per_call(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Median seconds per call."""
    return statistics.median(t / number for t in timeit.repeat(fn, number=number, repeat=repeat))


def encoding(repeat: int) -> list[tuple[str, str]]:
    p = pod(1)
    raw = orjson.dumps(p)
    text = raw.decode()
    rows = [("pod JSON size", f"{len(raw)} bytes")]
    for name, fn in (
        ("orjson.dumps", lambda: orjson.dumps(p)),
        ("json.dumps", lambda: json.dumps(p)),
        ("orjson.loads", lambda: orjson.loads(raw)),
        ("json.loads", lambda: json.loads(text)),
    ):
        rows.append((name, f"{per_call(fn, repeat, 2000) * 1e6:.2f} µs"))
    return rows


def list_bodies(repeat: int) -> list[tuple[str, str]]:
    rows = []
    for n in (500, 5000):
        pods = [pod(i) for i in range(n)]
        cached = [encode_object(PODS, orjson.loads(orjson.dumps(x))) for x in pods]
        items = [part for obj in cached for part in (b"{", obj.body, b",")]

        def join(items: list[bytes] = items) -> bytes:
            return b"".join(items)

        def encode(pods: list[dict[str, Any]] = pods) -> bytes:
            return orjson.dumps({"kind": "PodList", "items": pods})

        size = len(join())
        rows.append(
            (f"LIST of {n} ({size / 1e6:.1f} MB): join cached bytes", f"{per_call(join, repeat, 10) * 1e3:.2f} ms")
        )
        rows.append((f"LIST of {n}: orjson re-encode", f"{per_call(encode, repeat, 5) * 1e3:.2f} ms"))
    return rows


def metrics(repeat: int) -> list[tuple[str, str]]:
    registry = CollectorRegistry()
    counter = Counter("c", "c", registry=registry)
    labelled = Counter("l", "l", ["verb"], registry=registry)
    histogram = Histogram("h", "h", registry=registry)
    box = [0]

    def plain() -> None:
        box[0] += 1

    rows = []
    for name, fn in (
        ("Counter.inc", counter.inc),
        ("Histogram.observe", lambda: histogram.observe(0.01)),
        ("Counter.labels(...).inc", lambda: labelled.labels("GET").inc()),
        ("int += 1 (a list cell)", plain),
    ):
        rows.append((name, f"{per_call(fn, repeat, 100_000) * 1e9:.0f} ns"))
    return rows


def _drain(fd: int, total: int) -> None:
    sock = socket.socket(fileno=fd)
    got = 0
    while got < total:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)


async def _writes(sock: socket.socket, frame: bytes, per_write: int, events: int) -> float:
    """Deliveries per second writing ``per_write`` frames per transport write."""
    loop = asyncio.get_running_loop()
    drained = asyncio.Event()
    drained.set()

    class Proto(asyncio.Protocol):
        def pause_writing(self) -> None:
            drained.clear()

        def resume_writing(self) -> None:
            drained.set()

    transport, _ = await loop.create_connection(Proto, sock=sock)
    batch = [frame] * per_write
    started = time.perf_counter()
    sent = 0
    while sent < events:
        if per_write == 1:
            transport.write(frame)
        else:
            transport.writelines(batch)
        sent += per_write
        if not drained.is_set():
            await drained.wait()
    while transport.get_write_buffer_size():
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - started
    transport.abort()
    return sent / elapsed


def writes(repeat: int, events: int) -> list[tuple[str, str]]:
    frame = b'{"type":"MODIFIED","object":' + orjson.dumps(pod(1)) + b"}\n"
    rows = []
    for per_write in (1, 16, 64):
        rates = []
        for _ in range(repeat):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            total = -(-events // per_write) * per_write * len(frame)
            reader = multiprocessing.Process(target=_drain, args=(theirs.fileno(), total))
            reader.start()
            theirs.close()
            rates.append(uvloop.run(_writes(ours, frame, per_write, events)))
            reader.join(10)
            reader.kill()
        rate = statistics.median(rates)
        rows.append((f"{per_write} event(s) of {len(frame)} B per write", f"{rate / 1e6:.2f} M deliveries/s"))
    return rows


def _tls_pair() -> tuple[ssl.SSLObject, ssl.MemoryBIO]:
    """A server-side ``SSLObject`` on memory BIOs (what uvloop's TLS transport drives), handshake done."""
    with tempfile.TemporaryDirectory() as d:
        crt, key = f"{d}/c.pem", f"{d}/k.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=bench"],
            check=True, capture_output=True,
        )  # fmt: skip
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain(crt, key)
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    client = cctx.wrap_bio(c_in, c_out)
    for _ in range(10):
        for end in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return server, s_out


def tls_writes(repeat: int) -> list[tuple[str, str]]:
    """uvloop's TLS write path per buffer handed to it (``SSL_write`` each, then the BIO read out)
    against the same bytes joined first: a watch chunk, and a LIST of 10,000 pods' item buffers."""
    server, out = _tls_pair()
    frame = b'{"type":"MODIFIED","object":' + orjson.dumps(pod(1)) + b"}\n"

    def each(parts: list[bytes]) -> Callable[[], object]:
        def run() -> None:
            for p in parts:
                server.write(p)
            out.read()

        return run

    def joined(parts: list[bytes]) -> Callable[[], object]:
        def run() -> None:
            server.write(b"".join(parts))
            out.read()

        return run

    rows = []
    for k in (1, 7):
        parts = [b"%x\r\n" % (k * len(frame)), *[frame] * k, b"\r\n"]
        a, b = per_call(each(parts), repeat, 2000), per_call(joined(parts), repeat, 2000)
        rows.append((f"chunk of {k} frame(s): {len(parts)} buffers vs joined", f"{a * 1e6:.1f} vs {b * 1e6:.1f} µs"))
    item = orjson.dumps(pod(1))[1:]
    parts = [b'{"kind":"PodList","items":[']
    for i in range(10_000):
        parts += [b"{" if i == 0 else b",{", item]
    slices = [parts[i : i + 600] for i in range(0, len(parts), 600)]  # send_stream's ~1 MB slices

    def sliced(f: Callable[[list[bytes]], Callable[[], object]]) -> Callable[[], object]:
        runs = [f(s) for s in slices]
        return lambda: [r() for r in runs]

    a, b = per_call(sliced(each), max(3, repeat // 2), 1), per_call(sliced(joined), max(3, repeat // 2), 1)
    rows.append(("LIST of 10,000 pods: 20,001 buffers vs 1 MB slices joined", f"{a * 1e3:.1f} vs {b * 1e3:.1f} ms"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and events")
    args = parser.parse_args()
    repeat, events = (3, 100_000) if args.quick else (7, 400_000)
    print(f"python {sys.version.split()[0]}, orjson {orjson.__version__}, uvloop {uvloop.__version__}")
    for title, rows in (
        ("encoding a 4 KB pod", encoding(repeat)),
        ("LIST bodies", list_bodies(repeat)),
        ("metrics", metrics(repeat)),
        ("socket writes (uvloop, unix socket pair)", writes(repeat, events)),
        ("TLS writes (SSLObject on memory BIOs, as uvloop's TLS transport)", tls_writes(repeat)),
    ):
        print(f"\n{title}")
        for name, value in rows:
            print(f"  {name:<48} {value}")


if __name__ == "__main__":
    main()

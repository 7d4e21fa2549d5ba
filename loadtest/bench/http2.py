"""HTTP/2 vs HTTP/1.1 watch fan-out over TLS: the same proxy, the same event stream, the same run.

One ``watchcache sim`` (the upstream, churning R pod events/s) and one ``watchcache serve
--http2 --workers 1`` over TLS in front of it. For each R, back to back:

* ``h1``: K watches on K HTTP/1.1 connections (ALPN http/1.1);
* ``h2``: the same K watches as streams, ``--streams`` per HTTP/2 connection (K/streams
  connections; 100 is kube's per-connection limit, so 1,000 watches are 10 connections).

Measured over the same window: events delivered to the clients per second, and the proxy's CPU
seconds per delivered event (``/proc``, its whole process tree). The clients run in another
process on raw sockets (uvloop + ssl): HTTP/1.1 counts event lines in the chunked body; HTTP/2
sends its requests with the ``h2`` library, then reads frames itself (a 9-byte header each:
DATA counted, SETTINGS and PING acknowledged, windows opened to 2 GB once) so that the client
keeps up; its CPU is printed next to the figures.

Run: ``.venv/bin/python -m loadtest.bench.http2`` (~2 min); ``--quick`` for a short one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtest.bench import lib as bl

WATCH = "/api/v1/pods?watch=1&resourceVersion=0&resourceVersionMatch=NotOlderThan&sendInitialEvents=false"
WATCH += "&timeoutSeconds=3600"
EVENT_END = b"}\n"  # every watch event line ends so; no JSON inside one contains it

# ---------------------------------------------------------------- client (a subprocess)


class _Counter:
    events = 0
    tail = b""


def _count(counter: type[_Counter], data: bytes | memoryview) -> None:
    chunk = bytes(data)
    counter.events += chunk.count(EVENT_END)
    if counter.tail == b"}" and chunk[:1] == b"\n":
        counter.events += 1
    counter.tail = chunk[-1:]


class H1Watch(asyncio.Protocol):
    def __init__(self, counter: type[_Counter], ready: list[int]) -> None:
        self.counter = counter
        self.ready = ready
        self.started = False
        self.last = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(f"GET {WATCH} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.started:
            self.started = True
            self.ready.append(1)
        n = data.count(EVENT_END)
        if self.last == b"}" and data[:1] == b"\n":
            n += 1
        self.last = data[-1:]
        self.counter.events += n


class H2Watches(asyncio.Protocol):
    """One HTTP/2 connection with ``streams`` watches; frames read by hand after the requests."""

    def __init__(self, counter: type[_Counter], ready: list[int], streams: int) -> None:
        import h2.config
        import h2.connection
        import h2.settings

        self.counter = counter
        self.ready = ready
        self.streams = streams
        self.buf = bytearray()
        self.consumed = 0
        self.heads = 0
        self.last: dict[int, bytes] = {}
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        sc = h2.settings.SettingCodes
        conn.local_settings = h2.settings.Settings(client=True, initial_values={sc.INITIAL_WINDOW_SIZE: 2**31 - 1})
        conn.initiate_connection()
        conn.increment_flow_control_window(2**31 - 1 - 65535)
        for _ in range(streams):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(
                sid,
                [(":method", "GET"), (":scheme", "https"), (":authority", "bench"), (":path", WATCH)],
                end_stream=True,
            )
        self.preface = conn.data_to_send()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.preface)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        size = len(buf)
        events = 0
        out = []
        while size - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            end = pos + 9 + length
            if end > size:
                break
            kind = buf[pos + 3]
            if kind == 0:  # DATA
                sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = buf[pos + 9 : end]
                events += payload.count(EVENT_END)
                if self.last.get(sid) == b"}" and payload[:1] == b"\n":
                    events += 1
                if length:
                    self.last[sid] = bytes(payload[-1:])
                self.consumed += length
            elif kind == 1:  # HEADERS: a watch answered
                self.heads += 1
                if self.heads == self.streams:
                    self.ready.append(self.streams)
            elif kind == 4 and not buf[pos + 4] & 1:  # SETTINGS: ack
                out.append(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
            elif kind == 6 and not buf[pos + 4] & 1:  # PING: ack
                out.append(b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + bytes(buf[pos + 9 : end]))
            pos = end
        del buf[:pos]
        self.counter.events += events
        if self.consumed > 1 << 30:  # the connection window: reopen what was read
            out.append(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" + self.consumed.to_bytes(4, "big"))
            self.consumed = 0
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _client(args: argparse.Namespace) -> None:
    import uvloop  # noqa: F401  (the loop policy is set by the caller)

    loop = asyncio.get_running_loop()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"] if args.proto == "h2" else ["http/1.1"])
    counter = _Counter
    ready: list[int] = []
    host, port = args.host, args.port
    if args.proto == "h1":
        for i in range(args.watches):
            await loop.create_connection(lambda: H1Watch(counter, ready), host, port, ssl=ctx)
            if i % 50 == 49:
                await asyncio.sleep(0)
    else:
        for _ in range(args.watches // args.streams):
            await loop.create_connection(lambda: H2Watches(counter, ready, args.streams), host, port, ssl=ctx)
    deadline = time.monotonic() + 60
    while sum(ready) < args.watches and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    print(json.dumps({"ready": sum(ready)}), flush=True)
    await asyncio.sleep(args.warmup)
    e0, c0, t0 = counter.events, bl.self_cpu(), time.monotonic()
    print(json.dumps({"start": True}), flush=True)
    await asyncio.sleep(args.seconds)
    e1, c1, t1 = counter.events, bl.self_cpu(), time.monotonic()
    print(json.dumps({"events": e1 - e0, "seconds": t1 - t0, "client_cpu": c1 - c0}), flush=True)


# ---------------------------------------------------------------- the run


def _run_variant(proxy: bl.Proc, port: int, proto: str, watches: int, streams: int, seconds: float) -> dict[str, Any]:
    cmd = bl.python_m("loadtest.bench.http2", "client", proto, "--port", str(port), "--watches", str(watches))
    cmd += ["--streams", str(streams), "--seconds", str(seconds)]
    env, cwd = bl.child_env()
    client = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd, preexec_fn=bl.child_preexec(), start_new_session=True
    )
    assert client.stdout is not None
    ready = json.loads(client.stdout.readline())
    json.loads(client.stdout.readline())  # measuring starts
    cpu0, busy0 = proxy.cpu(), bl.machine_busy()
    result = json.loads(client.stdout.readline())
    cpu1, busy1 = proxy.cpu(), bl.machine_busy()
    client.wait(30)
    events = result["events"]
    server_cpu = cpu1 - cpu0
    return {
        "proto": proto,
        "watches": ready["ready"],
        "events_per_s": events / result["seconds"],
        "server_cpu_s": server_cpu,
        "server_us_per_event": 1e6 * server_cpu / events if events else float("nan"),
        "server_core": server_cpu / result["seconds"],
        "client_core": result["client_cpu"] / result["seconds"],
        "machine_busy": (busy1[0] - busy0[0]) / max(1e-9, busy1[1] - busy0[1]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "client"])
    p.add_argument("proto", nargs="?", default="h2", choices=["h1", "h2"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--watches", type=int, default=1000)
    p.add_argument("--streams", type=int, default=100, help="HTTP/2 streams per connection (kube's limit: 100)")
    p.add_argument("--rates", default="10,30,60", help="pod events/s written upstream, one run each")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.mode == "client":
        import uvloop

        uvloop.install()
        asyncio.run(_client(args))
        return
    if args.quick:
        args.rates, args.seconds, args.watches = "20", 5.0, 400
    bl.raise_nofile()
    with tempfile.TemporaryDirectory() as d:
        key, crt = Path(d) / "k.pem", Path(d) / "c.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
             "-days", "1", "-subj", "/CN=127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        rows = []
        for rate in [float(r) for r in args.rates.split(",")]:
            sim = bl.start_sim(objects=1000, churn=rate)
            proxy = None
            try:
                proxy = bl.start_process(
                    "proxy",
                    [*bl.watchcache_exe(), "serve", "--listen", "127.0.0.1:0", "--upstream", sim.url, "--workers", "1",
                     *bl.LOCAL_CLIENTS, "--max-watchers", "100000", "--http2",
                     "--tls-cert-file", str(crt), "--tls-private-key-file", str(key)],
                )  # fmt: skip
                port = int(proxy.url.rsplit(":", 1)[1])
                ctx = ssl._create_unverified_context()
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        with urllib.request.urlopen(proxy.url + "/readyz", timeout=2, context=ctx) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        pass
                    time.sleep(0.2)
                for proto in ("h1", "h2"):
                    row = _run_variant(proxy, port, proto, args.watches, args.streams, args.seconds)
                    row["rate"] = rate
                    rows.append(row)
                    bl.bench_line("http2", row)
                    time.sleep(1.0)
            finally:
                bl.stop_all([proxy, sim])
        bl.print_table(
            ["rate", "proto", "watches", "events/s", "server µs/event", "server core", "client core", "busy"],
            [
                (
                    r["rate"],
                    r["proto"],
                    r["watches"],
                    r["events_per_s"],
                    r["server_us_per_event"],
                    r["server_core"],
                    r["client_core"],
                    r["machine_busy"],
                )
                for r in rows
            ],
            title=f"{args.watches} watches over TLS: HTTP/1.1 (1 per connection) vs HTTP/2 ({args.streams} per "
            "connection)",
        )


if __name__ == "__main__":
    main()

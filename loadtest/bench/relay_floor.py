"""The CPU floor under a node-scoped relay: the cheapest Python server kubelets can watch pods through.

Measured because the proxy's marginal CPU per pod event that one kubelet watch in thousands
selects (``loadtest.bench.kubelets``) is 4–5× the goal, with no single hotspot: at ~100 events/s
on a shared 2-core machine each event is its own wakeup, and every step of the path runs with
cold caches. This server does the least work such a relay can do, in the same process model
(one uvloop process, TLS on both sides), so the difference proxy − floor is what the proxy's own
code costs, and the floor is what any Python relay pays in that regime:

* upstream: one watch of pods in all namespaces (``LIST ?limit=1`` for the current
  resourceVersion, then ``WATCH`` from it with bookmarks, as the proxy's reflector), over TLS
  with the proxy's credentials, read by a bare ``asyncio.Protocol`` and httptools (chunked
  bodies decoded in C), cut into lines;
* per event: ``orjson.loads`` of the line, ``object.spec.nodeName``, a dict lookup of that
  node's pod watches, and for each one ``transport.write`` of one HTTP chunk holding the line
  as it came (a JSON watch event);
* clients (HTTP/1.1 over TLS, the proxy's serving certificate and TLS settings): a LIST gets an
  empty list at the current resourceVersion (JSON), a WATCH gets ``200`` chunked and is
  registered by its ``fieldSelector=spec.nodeName=<node>`` if it is a pod watch; other
  watches (Nodes, ConfigMaps) stay open and idle; ``timeoutSeconds`` ends a watch with the last
  chunk, the connection kept alive. ``/readyz`` answers 200 once the upstream watch is open.

Nothing else: no authentication or authorization of the clients, no cache, no history (a
watch gets the events from the moment it is registered, whatever resourceVersion it asked
for), no bookmarks to clients, no flow control (a slow client's bytes pile up in its transport).

Run (prints ``ready: listening on https://…``, as ``watchcache serve``)::

    python -m loadtest.bench.relay_floor --listen 127.0.0.1:0 \\
        --tls-cert-file serving.crt --tls-private-key-file serving.key \\
        --upstream https://127.0.0.1:PORT --insecure-skip-tls-verify --token-file token
        # or: --kubeconfig FILE

``loadtest.bench.kubelets --targets proxy,floor`` starts it next to the proxy and measures both alike.

``--warm [N]`` instead measures the same per-event path in one process, hot in the caches: an event
record TLS-decrypted as from the upstream, its chunk parsed by httptools, ``Relay.on_line``, and
the frame TLS-encrypted for the kubelet (memory BIOs, as uvloop's TLS; no sockets, no wakeups),
each step alone and all together, in µs per event. Against what the served floor costs per event,
it says how much of that is the regime (a wakeup per event, cold caches, the kernel) rather than
the work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httptools
import orjson

from loadtest.bench.lib import make_tls_cert, server_tls

log = logging.getLogger("relay_floor")

KINDS = {"pods": "PodList", "nodes": "NodeList", "configmaps": "ConfigMapList"}
_WATCH_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_LAST_CHUNK = b"0\r\n\r\n"


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _status(code: int, reason: str, message: str) -> bytes:
    body = orjson.dumps(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
         "reason": reason, "code": code}
    )  # fmt: skip
    return _response(f"{code} {reason}", body)


# ---------------------------------------------------------------- the relay


_NODE = b'"nodeName":"'


class Relay:
    """The upstream's current resourceVersion and the pod watches by node; relays each event."""

    def __init__(self, parse: str = "orjson") -> None:
        if parse == "find":
            self.on_line = self.on_line_find  # type: ignore[method-assign]
        self.rv = ""
        self.pods: dict[str, set[Client]] = {}
        self.ready = False
        self.events = 0  # upstream events (bookmarks apart)
        self.sent = 0  # frames written to clients

    def on_line(self, line: bytes) -> None:
        """One upstream watch event: the whole per-event path of the floor."""
        event = orjson.loads(line)
        obj = event["object"]
        kind = event["type"]
        if kind == "BOOKMARK":
            self.rv = obj["metadata"]["resourceVersion"]
            return
        if kind == "ERROR":
            raise Expired(obj.get("message", "ERROR event"))
        self.events += 1
        self.rv = obj["metadata"]["resourceVersion"]
        node = obj["spec"].get("nodeName")
        watches = self.pods.get(node) if node else None
        if watches:
            frame = b"%x\r\n%b\n\r\n" % (len(line) + 1, line)
            for client in watches:
                client.transport.write(frame)
            self.sent += len(watches)

    def on_line_find(self, line: bytes) -> None:
        """``--parse find``: the node found by a byte search, no JSON decoding (what the parse costs)."""
        i = line.find(_NODE)
        if i < 0:
            if b'"type":"ERROR"' in line[:32]:
                raise Expired(line[:300].decode(errors="replace"))
            return
        self.events += 1
        i += len(_NODE)
        watches = self.pods.get(line[i : line.index(b'"', i)].decode())
        if watches:
            frame = b"%x\r\n%b\n\r\n" % (len(line) + 1, line)
            for client in watches:
                client.transport.write(frame)
            self.sent += len(watches)

    def register(self, node: str, client: Client) -> None:
        self.pods.setdefault(node, set()).add(client)

    def unregister(self, node: str, client: Client) -> None:
        watches = self.pods.get(node)
        if watches is not None:
            watches.discard(client)
            if not watches:
                del self.pods[node]


class Expired(Exception):
    """The upstream ended the watch with an ERROR event (410): list again for a new resourceVersion."""


# ---------------------------------------------------------------- clients


class Client(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, one request at a time (as the kubelet clients send)."""

    __slots__ = ("parser", "relay", "timer", "transport", "url", "watching")

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.watching: str | None = None  # the node of an open pod watch; "" for an idle watch
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_status(400, "BadRequest", "malformed HTTP request"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_watch()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        url, self.url = self.url, b""
        if self.watching is not None:  # a request on a connection whose watch is open: not ours to serve
            self.transport.close()
            return
        self.transport.write(self._answer(url.decode("latin-1")))

    def _answer(self, url: str) -> bytes:
        path, _, raw_query = url.partition("?")
        if path in ("/readyz", "/healthz", "/livez"):
            if path == "/readyz" and not self.relay.ready:
                return _status(503, "ServiceUnavailable", "the upstream watch is not open yet")
            return _response("200 OK", b"ok", "text/plain")
        resource = path.rsplit("/", 1)[-1]
        if not path.startswith("/api/v1/") or resource not in KINDS:
            return _status(404, "NotFound", f"{path}: the floor serves LIST and WATCH of pods, nodes, configmaps")
        query = dict(parse_qsl(raw_query))
        if query.get("watch") not in ("true", "1"):
            meta = {"resourceVersion": self.relay.rv}
            return _response("200 OK", orjson.dumps({"kind": KINDS[resource], "apiVersion": "v1", "metadata": meta,
                                                      "items": []}))  # fmt: skip
        node = ""
        selector = query.get("fieldSelector", "")
        if resource == "pods" and selector.startswith("spec.nodeName="):
            node = selector.partition("=")[2]
            self.relay.register(node, self)
        self.watching = node
        timeout = query.get("timeoutSeconds")
        if timeout:
            self.timer = asyncio.get_running_loop().call_later(float(timeout), self._timed_out)
        return _WATCH_HEAD

    def _timed_out(self) -> None:
        self.timer = None
        self._end_watch()
        if not self.transport.is_closing():
            self.transport.write(_LAST_CHUNK)

    def _end_watch(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.watching:
            self.relay.unregister(self.watching, self)
        self.watching = None


# ---------------------------------------------------------------- the upstream


class UpstreamResponse(asyncio.Protocol):
    """One request to the upstream; a LIST's body is kept whole, a WATCH's is cut into lines."""

    def __init__(self, request: bytes, on_line: Callable[[bytes], None] | None = None) -> None:
        self.request = request
        self.on_line = on_line
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.body: list[bytes] = []
        self.buf = b""
        self.error: BaseException | None = None
        self.opened: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            # What a callback raised (Expired, a line that is not JSON) comes wrapped: end the stream with it.
            self._finish(e.__context__ if isinstance(e.__context__, Exception) else e)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("the upstream closed the connection"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self.opened.done():
            self.opened.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        if self.on_line is None or self.status != 200:
            self.body.append(body)
            return
        buf = self.buf + body if self.buf else body
        on_line = self.on_line
        start = 0
        end = buf.find(b"\n")
        while end != -1:
            if end > start:
                on_line(buf[start:end])
            start = end + 1
            end = buf.find(b"\n", start)
        self.buf = buf[start:]

    def on_message_complete(self) -> None:
        self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(error or ConnectionError("no response"))
        if not self.done.done():
            self.error = error
            self.done.set_result(None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Upstream:
    """Where and how to reach the apiserver: URL, TLS context, the Authorization header."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None, token: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl_context
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""

    async def request(self, path: str, on_line: Callable[[bytes], None] | None = None) -> UpstreamResponse:
        head = (
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUser-Agent: watchcache-bench/relay-floor\r\n"
            f"Accept: application/json\r\n{self.auth}\r\n"
        )
        resp = UpstreamResponse(head.encode("latin-1"), on_line)
        await asyncio.get_running_loop().create_connection(lambda: resp, self.host, self.port, ssl=self.ssl)
        return resp


async def list_rv(up: Upstream) -> str:
    resp = await up.request("/api/v1/pods?limit=1")
    await resp.done
    body = b"".join(resp.body)
    if resp.status != 200:
        raise RuntimeError(f"LIST pods: {resp.status} {body[:300]!r}")
    rv: str = orjson.loads(body)["metadata"]["resourceVersion"]
    return rv


async def follow(up: Upstream, relay: Relay) -> None:
    """LIST for the rv, then WATCH from the last rv seen, again whenever the stream ends."""
    relay.rv = await list_rv(up)
    while True:
        params = {"watch": "true", "resourceVersion": relay.rv, "allowWatchBookmarks": "true", "timeoutSeconds": "1800"}
        resp = await up.request("/api/v1/pods?" + urlencode(params), relay.on_line)
        try:
            status = await resp.opened
        except (OSError, ConnectionError) as e:
            log.warning("upstream watch failed: %s", e)
            await asyncio.sleep(1)
            continue
        if status == 410:
            relay.rv = await list_rv(up)
            continue
        if status != 200:
            await resp.done
            raise RuntimeError(f"WATCH pods: {status} {b''.join(resp.body)[:300]!r}")
        relay.ready = True
        await resp.done
        if isinstance(resp.error, Expired):
            log.warning("upstream watch expired (%s): listing again", resp.error)
            relay.rv = await list_rv(up)
        elif resp.error is not None:
            log.info("upstream watch ended: %s", resp.error)


# ---------------------------------------------------------------- the same path, warm


def _tls_pair(server_ctx: ssl.SSLContext) -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO]]:
    """A handshaken (client, server) pair of SSLObjects on memory BIOs: [c_in, c_out, s_in, s_out]."""
    client_ctx = ssl.create_default_context()
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    client_ctx.set_alpn_protocols(["http/1.1"])
    bios = [ssl.MemoryBIO() for _ in range(4)]
    c = client_ctx.wrap_bio(bios[0], bios[1], server_side=False)
    s = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
    for _ in range(10):
        for obj in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                obj.do_handshake()
        bios[2].write(bios[1].read())
        bios[0].write(bios[3].read())
    c.do_handshake()
    s.do_handshake()
    return c, s, bios


class _TlsTransport:
    """A transport whose write encrypts, as uvloop's TLS transport does before its send."""

    def __init__(self, obj: ssl.SSLObject, out: ssl.MemoryBIO) -> None:
        self.obj = obj
        self.out = out
        self.sent = 0

    def write(self, data: bytes) -> None:
        self.obj.write(data)
        self.sent += len(self.out.read())


def sample_event() -> bytes:
    """A pod event as the benchmark's writer makes them on the sim (fixtures' pod, ~3 KB)."""
    import random

    from loadtest.bench.kubecluster import Layout, _pod

    layout = Layout()
    pod = _pod(layout, layout.pod(1, 0), layout.namespace, layout.node(1), random.Random(1), layout.cm_prefix + "00001")
    pod["metadata"].update(resourceVersion="123456", uid="0f6d3a47-5e0e-4a4e-9d0c-3c1a2a0c0b61")
    pod["metadata"]["annotations"]["bench/written-at"] = "1795780969.342838"
    return orjson.dumps({"type": "MODIFIED", "object": pod})


async def warm(n: int) -> dict[str, float]:
    """µs per event of each step of the floor's per-event path, and of the whole, in a hot loop."""
    import tempfile
    import time

    line = sample_event()
    chunk = b"%x\r\n%b\n\r\n" % (len(line) + 1, line)
    with tempfile.TemporaryDirectory() as d:
        cert, key = make_tls_cert(Path(d))
        ctx = server_tls(str(cert), str(key))
        # The upstream leg: the floor is the client (reads), the sim the server (writes).
        up_c, up_s, up_bios = _tls_pair(ctx)
        # The kubelet leg: the floor is the server (writes).
        _, down_s, down_bios = _tls_pair(ctx)
    relay = Relay()
    client = Client(relay)
    client.transport = _TlsTransport(down_s, down_bios[3])  # type: ignore[assignment]
    relay.register("i25-node-00001", client)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream = UpstreamResponse(b"", relay.on_line)
    stream.data_received(head)
    quiet = UpstreamResponse(b"", Relay().on_line)  # no watch of that node: the parse and lookup alone
    quiet.data_received(head)
    records: list[bytes] = []

    def encrypt_records() -> None:  # the upstream's side, not timed
        records.clear()
        for _ in range(n):
            up_s.write(chunk)
            records.append(up_bios[3].read())
        records.reverse()

    def per_event(fn: Callable[[], object], prepare: Callable[[], None] | None = None) -> float:
        """CPU µs per call (this thread's, so time the machine gives others is not counted), best of 5 rounds."""
        best = float("inf")
        for _ in range(5):
            if prepare is not None:
                prepare()
            t0 = time.thread_time()
            for _ in range(n):
                fn()
            best = min(best, (time.thread_time() - t0) / n * 1e6)
        return best

    def decrypt() -> None:
        up_bios[0].write(records.pop())
        up_c.read(65536)

    def whole() -> None:
        up_bios[0].write(records.pop())
        stream.data_received(up_c.read(65536))

    out: dict[str, float] = {}
    out["orjson.loads of the event"] = per_event(lambda: orjson.loads(line))
    out["TLS decrypt of its record (upstream)"] = per_event(decrypt, encrypt_records)
    out["httptools chunk + split + on_line, no watch"] = per_event(lambda: quiet.data_received(chunk))
    out["TLS encrypt of the frame (kubelet)"] = per_event(lambda: client.transport.write(chunk))
    out["whole path: decrypt, parse, on_line, encrypt"] = per_event(whole, encrypt_records)
    assert relay.sent >= n, "the whole path did not relay"
    return {k: round(v, 2) for k, v in out.items()}


# ---------------------------------------------------------------- main


def upstream_from_args(args: argparse.Namespace) -> Upstream:
    if args.kubeconfig:
        from watchcache.upstream.kubeconfig import from_kubeconfig

        cfg = from_kubeconfig(args.kubeconfig)
        token = cfg.token or (Path(cfg.token_file).read_text().strip() if cfg.token_file else "")
        return Upstream(cfg.server, cfg.ssl_context(), token)
    context = None
    if args.upstream.startswith("https://"):
        context = ssl.create_default_context(cafile=args.certificate_authority or None)
        if args.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["http/1.1"])
    token = ""
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
    return Upstream(args.upstream, context, token)


async def amain(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    relay = Relay(args.parse)
    up = upstream_from_args(args)
    host, _, port = args.listen.rpartition(":")
    tls = server_tls(args.tls_cert_file, args.tls_private_key_file) if args.tls_cert_file else None
    server = await loop.create_server(lambda: Client(relay), host, int(port), ssl=tls, backlog=4096)
    bound = server.sockets[0].getsockname()
    following = asyncio.ensure_future(follow(up, relay))
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    print(f"ready: listening on {'https' if tls else 'http'}://{bound[0]}:{bound[1]}", flush=True)
    await asyncio.wait([following, stop], return_when=asyncio.FIRST_COMPLETED)
    if following.done() and following.exception() is not None:
        log.error("upstream: %s", following.exception())
    following.cancel()
    server.close()
    watches = sum(len(v) for v in relay.pods.values())
    print(f"relay_floor: {relay.events} events, {relay.sent} frames sent, {watches} pod watches open", flush=True)


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--tls-cert-file", default="")
    p.add_argument("--tls-private-key-file", default="")
    p.add_argument("--upstream", default="", help="https://host:port of the apiserver")
    p.add_argument("--kubeconfig", default="", help="the apiserver and credentials from a kubeconfig instead")
    p.add_argument("--token-file", default="")
    p.add_argument("--certificate-authority", default="")
    p.add_argument("--insecure-skip-tls-verify", action="store_true")
    p.add_argument(
        "--parse",
        choices=("orjson", "find"),
        default="orjson",
        help="find: the node by a byte search, not orjson.loads (what the parse costs; LISTs keep the first rv)",
    )
    p.add_argument(
        "--warm",
        type=int,
        nargs="?",
        const=20000,
        default=0,
        metavar="N",
        help="measure the per-event path in one process, hot, over N events; serve nothing",
    )
    args = p.parse_args(argv)
    if args.warm:
        import json

        from loadtest.bench import lib as bl

        result = asyncio.run(warm(args.warm))
        line = sample_event()
        bl.print_table(["step", "µs / event"], list(result.items()), title=f"Warm, one event of {len(line)} bytes")
        bl.bench_line("relay_floor_warm", {"machine": bl.machine_info(), "event_bytes": len(line), "us": result})
        print(json.dumps(result))
        return
    if not (args.upstream or args.kubeconfig):
        p.error("--upstream or --kubeconfig is required")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    uvloop.run(amain(args))


if __name__ == "__main__":
    main()

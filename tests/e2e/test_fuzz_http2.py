"""Hostile HTTP/2 against a running server (`serve --http2` over TLS in front of `watchcache sim`):
generated frames and header blocks must get a Status (4xx), a stream reset or a GOAWAY, never a
5xx, a traceback, a hang or unbounded memory. The HTTP/1.1 side is tests/e2e/test_fuzz.py.

Frames are written raw (hyperframe, and an HPACK encoder that writes any bytes), not through a
client library, which would refuse to send most of them: pseudo-headers missing, repeated or
after regular fields, names and values with any byte, Content-Length against the body sent,
DATA on streams that are not open, resets, window updates, SETTINGS, PRIORITY, CONTINUATION
out of place, and then byte-level mutations of a valid request's frames. Each case runs on its
own connection, followed by a PING: once its ACK arrives every frame was read, and answers that
started are collected a little longer. Short in CI; WATCHCACHE_FUZZ_LONG=1 for the long run.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.pki import Pki
from harness.processes import Proc, rss_kb, start

pytestmark = pytest.mark.timeout(300)

LONG = os.environ.get("WATCHCACHE_FUZZ_LONG") == "1"
STRUCTURED = 3_000 if LONG else 300
RAW = 10_000 if LONG else 1_000
PARALLEL = 8
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PING = b"fuzzdone"

PATHS = [
    b"/api/v1/namespaces/ns-0/pods",
    b"/api/v1/namespaces/ns-0/pods?limit=2",
    b"/api/v1/namespaces/ns-0/pods?watch=1&timeoutSeconds=1",
    b"/api/v1/namespaces/ns-0/configmaps",
    b"/api/v1/namespaces/ns-0/pods/x/exec?command=ls",
    b"/apis/apps/v1/deployments",
    b"/readyz",
    b"/api",
    b"*",
    b"",
    b"http://h/api/v1/pods",
    b"/%2e%2e/x",
    b"/api/v1/pods?limit=%ff",
    b"/\xff\xfe",
]
NAMES = [
    b"accept",
    b"content-type",
    b"content-length",
    b"authorization",
    b"impersonate-user",
    b"impersonate-group",
    b"te",
    b"connection",
    b"upgrade",
    b"transfer-encoding",
    b"x-remote-user",
    b"cookie",
    b"host",
    b"X-Upper",
    b"x a",
    b"",
    b":path",
    b":method",
    b":status",
    b":protocol",
]
VALUES = st.one_of(
    st.sampled_from(
        [
            b"application/json",
            b"application/vnd.kubernetes.protobuf",
            b"*/*",
            b"0",
            b"-1",
            b"5",
            b"99999999999999999999",
            b"1, 2",
            b"trailers",
            b"close",
            b"websocket",
            b"chunked",
            b"Bearer x",
            b"jos\xc3\xa9",
            b"jos\xe9",
            b"a\r\nb",
            b"a\x00b",
            b"",
        ]
    ),
    st.binary(max_size=30),
)


class Answers:
    """What the server sent on one connection: statuses by stream, resets, GOAWAY, the PING ACK."""

    def __init__(self) -> None:
        self.decoder = hpack.Decoder()
        # A generated SETTINGS_HEADER_TABLE_SIZE may let the server's encoder grow its table past hpack's
        # default 4,096 (RFC 7541 §4.2): this client accepts whatever its frames advertised.
        self.decoder.max_allowed_table_size = 2**32 - 1
        self.block = b""
        self.statuses: list[int] = []
        self.resets: list[int] = []
        self.goaway: int | None = None
        self.acked = False
        self.waiting = False
        self.buffer = b""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + length:
                return
            kind, flags = self.buffer[3], self.buffer[4]
            payload = self.buffer[9 : 9 + length]
            self.buffer = self.buffer[9 + length :]
            if kind in (0x1, 0x9):  # HEADERS, CONTINUATION (the server pads nothing and sends no priority)
                self.block += payload
                if flags & 0x4:
                    fields = self.decoder.decode(self.block, raw=True)
                    self.block = b""
                    self.statuses += [int(v) for k, v in fields if k == b":status"]
            elif kind == 0x3:
                self.resets.append(int.from_bytes(payload[:4], "big"))
            elif kind == 0x7:
                self.goaway = int.from_bytes(payload[4:8], "big")
            elif kind == 0x6 and flags & 0x1 and payload == PING:
                self.acked = True


def encode(fields: list[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of ``fields`` as given (hpack's encoder checks nothing), literal, never indexed."""
    return hpack.Encoder().encode(fields, huffman=False)


async def exchange(port: int, ctx: ssl.SSLContext, frames: bytes) -> Answers:
    """One connection: preface, our SETTINGS, ``frames``, a PING; the server's frames until its ACK
    (or the close), then a little longer for answers already under way."""
    answers = Answers()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx), 10)
    except (OSError, TimeoutError) as e:
        raise AssertionError(f"cannot connect: {e}") from e
    writer.write(PREFACE + SettingsFrame(0).serialize() + frames + PingFrame(0, opaque_data=PING).serialize())
    loop = asyncio.get_running_loop()
    deadline = None
    try:
        while True:
            timeout = 2.0 if deadline is None else deadline - loop.time()
            if timeout <= 0:
                break
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout)
            except TimeoutError:
                # No ACK: a frame whose length runs past what was sent (a mutated length) swallowed
                # the PING, and the server waits for its end, as it should (the idle timeout ends it).
                answers.waiting = deadline is None
                break
            if not data:
                break
            answers.feed(data)
            if answers.acked and deadline is None:
                deadline = loop.time() + 0.15
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()
    return answers


def judge(answers: Answers, what: object) -> None:
    bad = [s for s in answers.statuses if s >= 500 and s not in (503, 504)]
    assert not bad, (bad, what)


def headers_frame(sid: int, block: bytes, end_stream: bool, split: int | None) -> bytes:
    """HEADERS (and a CONTINUATION when ``split`` cuts the block)."""
    if split is None or split >= len(block):
        frame = HeadersFrame(sid, data=block, flags=["END_HEADERS"] + (["END_STREAM"] if end_stream else []))
        return frame.serialize()
    first = HeadersFrame(sid, data=block[:split], flags=["END_STREAM"] if end_stream else [])
    return first.serialize() + ContinuationFrame(sid, data=block[split:], flags=["END_HEADERS"]).serialize()


@st.composite
def cases(draw: st.DrawFn) -> bytes:
    """A few streams of generated requests, and frames around them."""
    out = b""
    sid = 1
    for _ in range(draw(st.integers(1, 3))):
        fields: list[tuple[bytes, bytes]] = []
        pseudo = [
            (b":method", draw(st.sampled_from([b"GET", b"GET", b"POST", b"PUT", b"HEAD", b"CONNECT", b"get", b""]))),
            (b":scheme", draw(st.sampled_from([b"https", b"http", b""]))),
            (b":path", draw(st.sampled_from(PATHS))),
            (b":authority", b"fuzz"),
        ]
        keep = draw(st.lists(st.booleans(), min_size=4, max_size=4))
        fields += [f for f, k in zip(pseudo, keep, strict=True) if k or draw(st.booleans())]
        fields += draw(st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=5))
        if draw(st.booleans()):
            fields = draw(st.permutations(fields))
        body = draw(st.one_of(st.just(b""), st.binary(max_size=40), st.just(b'{"metadata":{"name":"fz"}}')))
        end_in_headers = not body and draw(st.booleans())
        block = encode(fields)
        split = draw(st.one_of(st.none(), st.integers(0, max(len(block), 1))))
        out += headers_frame(sid, block, end_in_headers, split)
        if body or not end_in_headers:
            out += DataFrame(sid, data=body, flags=["END_STREAM"] if draw(st.booleans()) else []).serialize()
        extra = draw(st.sampled_from(["", "", "rst", "window", "priority", "data-closed", "settings", "cont"]))
        if extra == "rst":
            out += RstStreamFrame(sid, error_code=draw(st.integers(0, 20))).serialize()
        elif extra == "window":
            increment = draw(st.integers(1, 2**31 - 1))
            out += WindowUpdateFrame(draw(st.sampled_from([0, sid])), window_increment=increment).serialize()
        elif extra == "priority":
            out += PriorityFrame(sid, depends_on=draw(st.sampled_from([0, sid, sid + 2]))).serialize()
        elif extra == "data-closed":
            out += DataFrame(draw(st.sampled_from([sid, sid + 2, 2])), data=b"x", flags=["END_STREAM"]).serialize()
        elif extra == "settings":
            out += SettingsFrame(0, settings={draw(st.integers(1, 8)): draw(st.integers(0, 2**32 - 1))}).serialize()
        elif extra == "cont":
            out += ContinuationFrame(sid, data=b"\x82", flags=["END_HEADERS"]).serialize()
        sid += draw(st.sampled_from([2, 2, 2, 1, 0]))
    return out


def valid_request() -> bytes:
    block = encode(
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", b"/api/v1/namespaces/ns-0/configmaps"),
            (b":authority", b"fuzz"),
            (b"content-type", b"application/json"),
            (b"content-length", b"26"),
        ]
    )
    frames: list[Frame] = [
        HeadersFrame(1, data=block, flags=["END_HEADERS"]),
        DataFrame(1, data=b'{"metadata":{"name":"fz"}}', flags=["END_STREAM"]),
    ]
    get = encode([(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/api/v1/pods?limit=1")])
    frames.append(HeadersFrame(3, data=get, flags=["END_HEADERS", "END_STREAM"]))
    return b"".join(f.serialize() for f in frames)


def mutations(seed: int, count: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    base = valid_request()
    for _ in range(count):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[pos] = rng.randrange(256)
            elif choice < 0.7:
                del data[pos : pos + rng.randint(1, 5)]
            else:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        yield bytes(data)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    pki = Pki(Path(tmp_path_factory.mktemp("h2fuzz")))
    ca = pki.ca("ca", "/CN=h2-fuzz-ca")
    srv = pki.issue(ca, "srv", "/CN=127.0.0.1", ip_san="127.0.0.1")
    sim = start("sim", "--objects", "20", "--namespaces", "2")
    try:
        proxy = start(
            "serve", "--upstream", sim.url, "--workers", "1", "--http2",
            "--tls-cert-file", str(srv.crt), "--tls-private-key-file", str(srv.key),
        )  # fmt: skip
    except BaseException:
        sim.stop()
        raise
    yield proxy
    proxy.stop()
    sim.stop()
    if path := os.environ.get("WATCHCACHE_FUZZ_LOG"):
        Path(path).write_text("".join(proxy.log))


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def test_generated_http2_frames_get_status_errors_resets_or_goaway_never_5xx(stack: Proc) -> None:
    port = int(stack.url.rsplit(":", 1)[1])
    ctx = client_context()
    rss_before = rss_kb(stack.process.pid)
    generated: list[bytes] = []

    @settings(max_examples=STRUCTURED, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(frames=cases())
    def collect(frames: bytes) -> None:
        generated.append(frames)

    collect()
    generated += mutations(21, RAW)
    seen = {"answered": 0, "reset": 0, "goaway": 0, "waiting": 0}

    async def run() -> None:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for frames in generated:
            queue.put_nowait(frames)

        async def worker() -> None:
            while not queue.empty():
                frames = queue.get_nowait()
                answers = await exchange(port, ctx, frames)
                judge(answers, frames[:300])
                seen["answered"] += bool(answers.statuses)
                seen["reset"] += bool(answers.resets)
                seen["goaway"] += answers.goaway is not None
                seen["waiting"] += answers.waiting
                if answers.waiting and os.environ.get("WATCHCACHE_FUZZ_LOG"):
                    print("waiting:", frames.hex())

        await asyncio.gather(*(worker() for _ in range(PARALLEL)))

    asyncio.run(run())
    print("HTTP/2 fuzz:", len(generated), "connections", seen)
    # The fuzz reached handlers, stream errors and connection errors alike.
    assert seen["answered"] > 50 and seen["reset"] > 20 and seen["goaway"] > 20, seen
    assert seen["waiting"] < len(generated) // 10, seen
    time.sleep(0.3)
    log = "".join(stack.log)
    assert "Traceback" not in log, log[-3000:]
    rss_after = rss_kb(stack.process.pid)
    assert rss_after < rss_before + 200_000, (rss_before, rss_after)
    check = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ssl._create_unverified_context())
    check.request("GET", "/readyz")
    assert check.getresponse().status == 200
    check.close()


def test_frame_helpers_write_what_they_say() -> None:
    answers = Answers()
    block = hpack.Encoder().encode([(b":status", b"200")])
    answers.feed(struct.pack(">I", len(block))[1:] + b"\x01\x04\x00\x00\x00\x01" + block)
    answers.feed(PingFrame(0, opaque_data=PING, flags=["ACK"]).serialize())
    assert answers.statuses == [200] and answers.acked

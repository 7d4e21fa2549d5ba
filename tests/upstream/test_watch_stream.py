"""The reflector's watch stream reader (``UpstreamClient.watch_into``) against a real socket.

The upstream here is a raw asyncio server, so each test decides exactly which bytes arrive in
which read: events split across reads and chunks, a Status answer, a stall, a stream cut short.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.pki import make_pki
from tests.support.execplugin import ExecPlugin
from tests.support.execplugin import kubeconfig as exec_kubeconfig
from tests.support.forwardproxy import ForwardProxy
from watchcache.resources import PODS
from watchcache.upstream.client import UpstreamClient, UpstreamError, WatchStalled
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.failures import CERTIFICATE, NOT_TLS, REFUSED, classify
from watchcache.upstream.kubeconfig import load

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def event(rv: int) -> bytes:
    return orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": f"p{rv}", "resourceVersion": str(rv)}}})


async def run(serve: Serve, *, stall: float = 5.0) -> tuple[list[list[bytes]], list[bytes], BaseException | None]:
    """Watch the server once; the batches handed over, the request it got, and how the watch ended."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}", token="t0k"))
    await client.start()
    batches: list[list[bytes]] = []
    error: BaseException | None = None
    try:
        await client.watch_into(PODS, {"resourceVersion": "5"}, batches.append, stall_timeout=stall)
    except Exception as e:
        error = e
    finally:
        await client.close()
        server.close()
    return batches, requests, error


def test_each_read_hands_over_its_complete_lines_in_order_and_the_end_of_the_stream_returns() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = event(6) + b"\n" + event(7)[:10]
        writer.write(HEAD + chunk(first))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(event(7)[10:] + b"\n"))  # the rest of the line, in the next read
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(event(8) + b"\n") + b"0\r\n\r\n")

    batches, requests, error = asyncio.run(run(serve))
    assert error is None
    assert batches == [[event(6)], [event(7)], [event(8)]]
    head = requests[0].decode()
    assert head.startswith("GET /api/v1/pods?watch=1&resourceVersion=5 HTTP/1.1\r\n")
    assert "Authorization: Bearer t0k\r\n" in head and "Accept: application/json\r\n" in head
    assert "Host: 127.0.0.1:" in head  # not the scheme's default port: named


def test_a_status_answer_is_an_upstream_error_with_its_status() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired", "message": "too old"}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = orjson.dumps(status)
        writer.write(b"HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body)

    batches, _, error = asyncio.run(run(serve))
    assert isinstance(error, UpstreamError) and error.code == 410 and error.reason == "Expired"
    assert batches == []


def test_a_silent_stream_is_stalled_after_the_stall_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def timed() -> tuple[float, BaseException | None, list[list[bytes]]]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        batches, _, error = await run(serve, stall=0.3)
        return loop.time() - t0, error, batches

    elapsed, error, batches = asyncio.run(timed())
    assert isinstance(error, WatchStalled)
    assert batches == [[event(6)]]
    assert 0.25 < elapsed < 2.0


def test_data_keeps_a_slow_stream_alive_past_the_stall_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        for rv in range(6, 12):
            await asyncio.sleep(0.1)
            writer.write(chunk(event(rv) + b"\n"))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    batches, _, error = asyncio.run(run(serve, stall=0.25))
    assert error is None
    assert [line for batch in batches for line in batch] == [event(rv) for rv in range(6, 12)]


def test_a_stream_cut_short_is_a_connection_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()

    batches, _, error = asyncio.run(run(serve))
    assert isinstance(error, ConnectionError)
    assert batches == [[event(6)]]


def test_what_the_consumer_raises_ends_the_watch_with_it() -> None:
    class Gone(Exception):
        pass

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def main() -> BaseException | None:
        server = await asyncio.start_server(lambda r, w: _served(r, w, serve), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}"))
        await client.start()

        def on_lines(lines: list[bytes]) -> None:
            raise Gone("410 in an ERROR event")

        try:
            await client.watch_into(PODS, {}, on_lines, stall_timeout=5.0)
        except Gone as e:
            return e
        finally:
            await client.close()
            server.close()
        return None

    assert isinstance(asyncio.run(main()), Gone)


async def _served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, serve: Serve) -> None:
    await reader.readuntil(b"\r\n\r\n")
    try:
        await serve(reader, writer)
    finally:
        writer.close()


def test_a_garbled_answer_is_a_connection_error_the_reflector_backs_off_from() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")

    _, _, error = asyncio.run(run(serve))
    assert isinstance(error, ConnectionError)


# ---------------------------------------------------------------- what i22 gave the upstream connection
# The watch stream dials as the tunnels do (``dialing.open_connection``): through proxy-url (HTTP
# CONNECT, SOCKS5), with the proxy's TLS context (its client certificate, an exec plugin's) and its
# credential headers; a 401 runs the exec plugin again; failures classify as the aiohttp path's.


async def _watch_once(
    config: UpstreamConfig, serve: Serve, ssl_server: ssl.SSLContext | None = None, *, port_holder: list[int]
) -> tuple[list[list[bytes]], list[bytes], list[Any], BaseException | None]:
    """Like ``run``, with a given config (its server's port filled in) and an optional TLS listener;
    also the client certificates the listener saw."""
    requests: list[bytes] = []
    peers: list[Any] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peercert"))
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port_holder[0], ssl=ssl_server)
    client = UpstreamClient(config)
    await client.start()
    batches: list[list[bytes]] = []
    error: BaseException | None = None
    try:
        await client.watch_into(PODS, {"resourceVersion": "5"}, batches.append, stall_timeout=5.0)
    except Exception as e:
        error = e
    finally:
        await client.close()
        server.close()
    return batches, requests, peers, error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _two_events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(HEAD + chunk(event(6) + b"\n" + event(7) + b"\n") + b"0\r\n\r\n")
    await writer.drain()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_server(pki: dict[str, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki["srv.crt"], pki["srv.key"])
    ctx.load_verify_locations(pki["ca.crt"])
    ctx.verify_mode = ssl.CERT_REQUIRED  # as kube-apiserver with the proxy's client certificate
    return ctx


@pytest.mark.parametrize("kind", ["direct", "http", "socks5"])
def test_over_tls_with_a_client_certificate_directly_or_through_proxy_url(kind: str, pki: dict[str, Path]) -> None:
    forward = ForwardProxy(kind) if kind != "direct" else None
    port = _free_port()
    config = UpstreamConfig(
        server=f"https://127.0.0.1:{port}",
        ca_file=str(pki["ca.crt"]),
        client_cert=str(pki["cli.crt"]),
        client_key=str(pki["cli.key"]),
        proxy_url=forward.url if forward else None,
        username="u",
        password="p",
    )
    try:
        batches, requests, peers, error = asyncio.run(
            _watch_once(config, _two_events, _tls_server(pki), port_holder=[port])
        )
    finally:
        if forward:
            forward.close()
    assert error is None
    assert batches == [[event(6), event(7)]]
    subject = dict(x[0] for x in peers[0]["subject"])
    assert subject["commonName"] == "alice"  # the proxy's client certificate, through the tunnel too
    assert "Authorization: Basic dTpw\r\n" in requests[0].decode()
    if forward is not None:
        expected = "CONNECT" if kind == "http" else "SOCKS5"
        assert forward.targets == [(expected, "127.0.0.1", port)]


def test_an_exec_plugin_token_is_sent_and_a_401_runs_the_plugin_again(tmp_path: Path) -> None:
    plugin = ExecPlugin(tmp_path)
    plugin.set("token", "t-1")
    port = _free_port()
    config = load(
        str(exec_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", plugin)), env={}, home=tmp_path
    )
    status = {"kind": "Status", "apiVersion": "v1", "code": 401, "reason": "Unauthorized", "message": "no"}
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if b"Bearer t-1" in seen[-1]:
            body = orjson.dumps(status)
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        else:
            await _two_events(reader, writer)

    async def scenario() -> tuple[BaseException | None, list[list[bytes]]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            try:
                await serve(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", port)
        client = UpstreamClient(config)
        await client.start()
        first: BaseException | None = None
        batches: list[list[bytes]] = []
        try:
            try:
                await client.watch_into(PODS, {}, batches.append, stall_timeout=5.0)
            except UpstreamError as e:
                first = e
            plugin.set("token", "t-2")
            await client.watch_into(PODS, {}, batches.append, stall_timeout=5.0)
        finally:
            await client.close()
            server.close()
        return first, batches

    first, batches = asyncio.run(scenario())
    assert isinstance(first, UpstreamError) and first.code == 401
    assert len(plugin.runs()) == 2  # the 401 made it run again before the next watch
    assert b"Authorization: Bearer t-2\r\n" in seen[1]
    assert batches == [[event(6), event(7)]]


def test_a_rotated_exec_certificate_ends_the_open_watch_streams(pki: dict[str, Path]) -> None:
    port = _free_port()
    config = UpstreamConfig(server=f"https://127.0.0.1:{port}", ca_file=str(pki["ca.crt"]))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki["srv.crt"], pki["srv.key"])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def scenario() -> BaseException | None:
        server = await asyncio.start_server(lambda r, w: _served(r, w, serve), "127.0.0.1", port, ssl=server_ctx)
        client = UpstreamClient(config)
        await client.start()
        batches: list[list[bytes]] = []

        def on_lines(lines: list[bytes]) -> None:
            batches.append(lines)
            # As an exec plugin's new certificate is handed over (Credentials.on_certificate).
            client._exec_certificate(pki["cli.crt"].read_bytes(), pki["cli.key"].read_bytes())

        try:
            await client.watch_into(PODS, {}, on_lines, stall_timeout=5.0)
        except ConnectionError as e:
            return e
        finally:
            await client.close()
            server.close()
        return None

    error = asyncio.run(scenario())
    assert isinstance(error, ConnectionResetError) and "certificate changed" in str(error)


def _classified(config: UpstreamConfig) -> str:
    async def scenario() -> BaseException:
        client = UpstreamClient(config)
        await client.start()
        try:
            await client.watch_into(PODS, {}, lambda lines: None, stall_timeout=5.0, connect_timeout=5.0)
        except Exception as e:
            return e
        finally:
            await client.close()
        raise AssertionError("the watch succeeded")

    return classify(asyncio.run(scenario()), "watch", PODS, config.server).reason


def test_its_failures_are_classified_as_the_aiohttp_paths(pki: dict[str, Path]) -> None:
    port = _free_port()  # nothing listens there
    assert _classified(UpstreamConfig(server=f"http://127.0.0.1:{port}")) == REFUSED

    async def bad_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # As Go's HTTP server answers a TLS client hello (or any request it cannot parse).
        writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def plain_then(check: Callable[[], Awaitable[str]], ssl_server: ssl.SSLContext | None) -> str:
        handler = bad_request if ssl_server is None else (lambda r, w: _served(r, w, _two_events))
        server = await asyncio.start_server(handler, "127.0.0.1", port, ssl=ssl_server)
        try:
            return await check()
        finally:
            server.close()

    async def in_thread(config: UpstreamConfig) -> str:
        return await asyncio.to_thread(_classified, config)

    # https:// to a plain-HTTP port; then a certificate signed by a CA not configured.
    not_tls = asyncio.run(plain_then(lambda: in_thread(UpstreamConfig(server=f"https://127.0.0.1:{port}")), None))
    assert not_tls == NOT_TLS
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki["srv.crt"], pki["srv.key"])
    untrusted = asyncio.run(
        plain_then(lambda: in_thread(UpstreamConfig(server=f"https://127.0.0.1:{port}")), server_ctx)
    )
    assert untrusted == CERTIFICATE

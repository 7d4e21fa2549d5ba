"""The HTTP client to the upstream apiserver (aiohttp), for the proxy's own requests.

A reflector's watch stream has a reader of its own (``watch_into``, ``_WatchStream``): an
``asyncio.Protocol`` on httptools that hands each network read's event lines to the reflector in
the same callback. Through aiohttp each event cost a stream-reader future, a task step and a
timeout scope: 180–220 µs of CPU per event against 105–125 µs (a 3 KB event over TLS, measured
as in docs/lab/performance-notebook.md, "Kubelet-shaped scale"), the largest part of the proxy's cost per
upstream event. Its connection is dialled as the tunnels' are (``dialing.open_connection``: direct,
or through the http(s)/socks5 proxy), with the same TLS context as aiohttp's (client certificate,
an exec plugin's included) and the same credential headers (a 401 tells the credentials).

``session`` carries the proxy's identity (reflectors, discovery, consistency probes). Pass-through
has a session per ``Route`` (``watchcache.upstream.identity``), each its own connection pool, since
a TLS connection's client certificate is fixed at its handshake: ``CLIENT`` presents no identity of
the proxy's (no client certificate, no token), so forwarded requests run with the client's
credentials only; ``FRONT_PROXY`` presents the front-proxy client certificate; ``PROXY`` the
proxy's own identity (for impersonation). The last two exist only when configured.
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
import httptools
import orjson
from google.protobuf.message import DecodeError

from watchcache.cache.scopestate import ScopeState
from watchcache.kubeproto import meta_pb2, objects
from watchcache.kubeproto.wire import MAGIC, METADATA_LIST_PROTOBUF, scope_summary
from watchcache.resources import ResourceType
from watchcache.upstream.config import ClientCertificate, UpstreamConfig, load_cert_chain_data
from watchcache.upstream.credentials import Credentials
from watchcache.upstream.dialing import open_connection, proxy_for, session_options
from watchcache.upstream.exchange import Answer, Exchanges
from watchcache.upstream.identity import IdentityOptions, Route

USER_AGENT = "watchcache/0.1"
# The pool key of the proxy's own exchange connections (pass-through ones are keyed by ``Route``).
_OWN = "own"


class UpstreamError(Exception):
    """A non-2xx answer, with the upstream's Status when it sent one."""

    def __init__(self, code: int, message: str, status: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status

    @property
    def reason(self) -> str:
        return str((self.status or {}).get("reason", ""))


class WatchStalled(Exception):
    """No byte (not even a bookmark) for longer than the stall timeout."""


def collection_path(resource: ResourceType, namespace: str | None = None) -> str:
    base = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    if namespace:
        return f"{base}/namespaces/{namespace}/{resource.resource}"
    return f"{base}/{resource.resource}"


async def _error_from(resp: aiohttp.ClientResponse) -> UpstreamError:
    return _error_from_body(resp.status, await resp.read())


def _error_from_body(code: int, body: bytes) -> UpstreamError:
    if body.startswith(MAGIC):  # a protobuf Status (the answer to a protobuf-only request)
        try:
            status = status_from_protobuf(objects.unknown(body).raw)
        except (objects.WireError, ValueError):
            pass
        else:
            return UpstreamError(code, str(status.get("message", "")), status)
    try:
        status = orjson.loads(body)
        if isinstance(status, dict) and status.get("kind") == "Status":
            return UpstreamError(code, str(status.get("message", "")), status)
    except orjson.JSONDecodeError:
        pass
    return UpstreamError(code, body[:200].decode("utf-8", "replace"))


def status_from_protobuf(raw: bytes) -> dict[str, Any]:
    """A protobuf Status message as the JSON Status the rest of the client reads (code, reason, message)."""
    try:
        msg = meta_pb2.Status.FromString(raw)
    except DecodeError as e:
        raise ValueError(str(e)) from None
    return {"kind": "Status", "status": msg.status, "message": msg.message, "reason": msg.reason, "code": msg.code}


Splitter = Callable[[bytes], tuple[list[bytes], bytes]]


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """A JSON watch stream's complete lines in ``data``, and the start of the next one."""
    lines = data.split(b"\n")
    pending = lines.pop()
    return [line for line in lines if line], pending


class _WatchStream(asyncio.Protocol):
    """One watch request on a connection of its own; each read's complete lines go to ``on_lines``.

    ``done`` ends with None when the upstream ends the stream (its timeout), else with the error:
    an ``UpstreamError`` for a non-200 answer, what ``on_lines`` raised (the reflector's ``Gone``),
    ``WatchStalled``, or ``ConnectionResetError`` for a connection lost mid-stream.
    """

    def __init__(
        self,
        request: bytes,
        on_lines: Callable[[list[bytes]], None],
        stall_timeout: float,
        split: Splitter = split_lines,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.request = request
        self.split = split
        self.on_lines = on_lines
        self.stall_timeout = stall_timeout
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.pending = b""
        self.error_body: list[bytes] = []
        self.last = self.loop.time()
        # One timer for the whole stream, moved on lazily: arming a timeout per read cost more
        # than the read itself.
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.done.done():  # closed while connecting (a certificate rotated)
            transport.close()
            return
        transport.write(self.request)  # type: ignore[attr-defined]
        self.timer = self.loop.call_at(self.last + self.stall_timeout, self._check_stall)

    def data_received(self, data: bytes) -> None:
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # what on_lines raised, chained by httptools
            self.end(e.__context__ if isinstance(e.__context__, Exception) else e)
        except httptools.HttpParserError as e:
            self.end(ConnectionError(f"bad answer from the upstream: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(ConnectionResetError(f"upstream closed the watch stream: {exc or 'EOF'}"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            self.error_body.append(body)
            return
        data = self.pending + body if self.pending else body
        items, self.pending = self.split(data)
        if items:
            self.on_lines(items)

    def on_message_complete(self) -> None:
        if self.status == 200:
            self.end(None)
        else:
            self.end(_error_from_body(self.status, b"".join(self.error_body)))

    def _check_stall(self) -> None:
        idle = self.loop.time() - self.last
        if idle >= self.stall_timeout:
            self.end(WatchStalled(f"no data for {self.stall_timeout:.0f}s"))
        else:
            self.timer = self.loop.call_at(self.last + self.stall_timeout, self._check_stall)

    def end(self, error: Exception | None) -> None:
        if self.done.done():
            return
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)
        self.close()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


# A header line that would end early: its value cannot be written as one line.
_UNWRITABLE = re.compile("[\r\n\x00]")


@functools.lru_cache(maxsize=8)
def _origin(server: str) -> tuple[bool, str, str, str, int]:
    """The upstream URL's parts a request is written with, parsed once: (https, path prefix, Host
    line, host, port)."""
    url = urlsplit(server)
    https = url.scheme == "https"
    port = url.port or (443 if https else 80)
    return https, url.path.rstrip("/"), f"Host: {url.netloc.rpartition('@')[2]}", url.hostname or "", port


def _check_writable(header_lines: list[tuple[str, str]]) -> None:
    """Raises the ValueError naming the first header line ``_exchange`` cannot write: a value with CR,
    LF or NUL, or a name that is not ASCII (values beyond ASCII are written as UTF-8)."""
    for name, value in header_lines:
        if "\r" in value or "\n" in value or "\x00" in value or not name.isascii():
            raise ValueError(f"header {name!r} has a value that cannot be written")


class UpstreamClient:
    def __init__(self, config: UpstreamConfig, identity: IdentityOptions | None = None) -> None:
        self.config = config
        self.identity = identity or IdentityOptions()
        # The proxy's own credential (token, token file, basic, exec plugin).
        self.tokens = Credentials(config)
        self.session: aiohttp.ClientSession | None = None
        # The TLS context of the proxy's own connections (an exec plugin's certificate is loaded into it).
        self.own_ssl: ssl.SSLContext | None = None
        self.passthrough: dict[Route, aiohttp.ClientSession] = {}
        # The TLS context of each pass-through route (None: plain http), for the tunnels'
        # connections, which are not aiohttp's.
        self.passthrough_ssl: dict[Route, ssl.SSLContext | None] = {}
        # The front-proxy client certificate, reloaded by ``reload_certificates`` when it rotates.
        self.front_proxy_cert: ClientCertificate | None = None
        # The reflectors' open watch streams (``watch_into``): closed with the session's connections
        # when an exec plugin's certificate rotates.
        self.watch_streams: set[_WatchStream] = set()
        # Short pass-throughs on pooled connections of their own (``exchange``): None through an
        # http(s)/socks proxy, where aiohttp's sessions carry them.
        self.exchanges: Exchanges | None = None if proxy_for(config) is not None else Exchanges()

    def _own_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            **session_options(self.config, self.own_ssl),
            timeout=aiohttp.ClientTimeout(total=None, connect=10.0),
            headers={"User-Agent": USER_AGENT},
            auto_decompress=True,
            skip_auto_headers=("Accept-Encoding",) if self.config.disable_compression else (),
        )

    def _exec_certificate(self, cert: bytes, key: bytes) -> None:
        """An exec plugin's client certificate: new connections present it, and the proxy's open
        connections (which presented the previous one) are closed, as client-go closes them."""
        if self.own_ssl is None:
            return  # plain http, or start() has not made the context yet (it loads the certificate then)
        load_cert_chain_data(self.own_ssl, cert, key)
        old, self.session = self.session, self._own_session()
        if old is not None:
            asyncio.get_running_loop().create_task(old.close())
        for stream in list(self.watch_streams):
            stream.end(ConnectionResetError("the exec plugin's client certificate changed"))
        if self.exchanges is not None:
            self.exchanges.close()  # idle connections that presented the previous certificate

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0)
        self.own_ssl = self.config.ssl_context()
        if self.tokens.plugin is not None:
            self.tokens.on_certificate = self._exec_certificate
            try:
                credential = await self.tokens.refresh()
            except OSError:
                pass  # logged; the first request runs it again
            else:
                if credential.client_cert and credential.client_key and self.own_ssl is not None:
                    load_cert_chain_data(self.own_ssl, credential.client_cert, credential.client_key)
        self.session = self._own_session()
        # Pass-through bytes go to the client as they came (gzip included), so no decompression.
        contexts: dict[Route, ssl.SSLContext | None] = {Route.CLIENT: self.config.ssl_context(with_client_cert=False)}
        options = self.identity
        if options.mode == "front-proxy" and options.proxy_client_cert_file and options.proxy_client_key_file:
            ctx = self.config.ssl_context(with_client_cert=False)
            if ctx is None:
                raise ValueError("--client-cert-passthrough=front-proxy needs an https upstream")
            self.front_proxy_cert = ClientCertificate(
                ctx, options.proxy_client_cert_file, options.proxy_client_key_file
            )
            contexts[Route.FRONT_PROXY] = ctx
        if options.mode == "impersonate":
            contexts[Route.PROXY] = self.config.ssl_context()
        self.passthrough_ssl = contexts
        for route, ctx in contexts.items():
            if route is Route.PROXY:
                ctx = self.own_ssl  # the proxy's own identity, an exec plugin's certificate included
                contexts[route] = ctx
            self.passthrough[route] = aiohttp.ClientSession(
                **session_options(self.config, ctx), timeout=timeout, auto_decompress=False
            )

    def passthrough_session(self, route: Route) -> tuple[aiohttp.ClientSession, dict[str, str]]:
        """The session for ``route`` and the headers it adds (the proxy's token on ``PROXY``)."""
        session = self.passthrough.get(route)
        assert session is not None, f"no pass-through session for {route.value} (start() not called?)"
        return session, self.route_headers(route)

    def route_headers(self, route: Route) -> dict[str, str]:
        """The headers a pass-through route adds: the proxy's token on ``PROXY``, else none."""
        return self.tokens.headers() if route is Route.PROXY else {}

    def reload_certificates(self) -> None:
        """Housekeeping: pick up a rotated front-proxy client certificate for new connections."""
        if self.front_proxy_cert is not None:
            self.front_proxy_cert.reload_if_changed()

    async def close(self) -> None:
        if self.exchanges is not None:
            self.exchanges.close()
        for s in (self.session, *self.passthrough.values()):
            if s is not None:
                await s.close()

    def exchange(
        self, route: Route, target: str, header_lines: list[tuple[str, str]], early: Answer | None = None
    ) -> Coroutine[Any, Any, Answer]:
        """A GET of ``target`` (escaped path and query, as sent) with ``header_lines`` on a pooled
        connection of ``route``'s TLS identity; returns once the answer's head came
        (``upstream/exchange.py``). Raises ValueError for a header that cannot be written. ``early``:
        the answer of ``exchange_now`` with the same arguments, sent already. (The coroutine of
        ``_exchange`` itself: no frame of its own, every passed-through GET awaits it.)"""
        return self._exchange(route, self.passthrough_ssl.get(route), target, header_lines, early=early)

    def exchange_now(self, route: Route, target: str, header_lines: list[tuple[str, str]]) -> Answer | None:
        """``exchange``'s GET sent at once on an idle pooled connection, without waiting for its answer;
        None when no connection is idle or a header cannot be written (``exchange`` will say why)."""
        assert self.exchanges is not None
        try:
            request = self._request_bytes("GET", target, header_lines, b"")
        except ValueError:
            return None
        return self.exchanges.send_now(route, request)

    def _request_bytes(self, method: str, target: str, header_lines: list[tuple[str, str]], body: bytes) -> bytes:
        _, base, host_line, _, _ = _origin(self.config.server)
        lines = [f"{method} {base}{target} HTTP/1.1", host_line]
        if body or method != "GET":
            lines.append(f"Content-Length: {len(body)}")
        written = [f"{name}: {value}" for name, value in header_lines]
        joined = "".join(written)  # one scan of every line for what would end one early
        if _UNWRITABLE.search(joined) is not None or not joined.isascii():
            _check_writable(header_lines)
        return ("\r\n".join([*lines, *written]) + "\r\n\r\n").encode("utf-8") + body

    async def _exchange(
        self,
        key: Route | str,
        ssl_context: ssl.SSLContext | None,
        target: str,
        header_lines: list[tuple[str, str]],
        *,
        method: str = "GET",
        body: bytes = b"",
        early: Answer | None = None,
    ) -> Answer:
        """``method`` with ``body``: only requests that may be sent twice (the exchange resends one
        once on a new connection when a pooled one was closed before any answer)."""
        assert self.exchanges is not None, "exchange() through a proxy: use an aiohttp session"
        if early is not None:
            answer = await self.exchanges.answer_of(early)
            if answer is not None:
                return answer
        https, _, _, host, port = _origin(self.config.server)
        request = self._request_bytes(method, target, header_lines, body)
        if not https:
            ssl_context = None
        server_hostname = (self.config.tls_server_name or host) if ssl_context is not None else None

        async def dial(protocol: asyncio.Protocol) -> object:
            return await open_connection(
                self.config, lambda: protocol, host, port, ssl_context=ssl_context, server_hostname=server_hostname
            )

        return await self.exchanges.request(key, dial, request)

    async def _own_get(
        self, target: str, headers: dict[str, str], *, method: str = "GET", body: bytes = b""
    ) -> tuple[int, bytes]:
        """The proxy's own GET (or idempotent ``method``) on a pooled exchange connection (its identity:
        ``own_ssl``)."""
        assert self.exchanges is not None
        lines = [("User-Agent", USER_AGENT), *headers.items()]
        answer = await self._exchange(_OWN, self.own_ssl, target, lines, method=method, body=body)
        try:
            parts: list[bytes] = []
            while chunks := await answer.more():
                parts += chunks
            return answer.status, b"".join(parts)
        finally:
            self.exchanges.finish(answer)

    async def post_review(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """A TokenReview or SubjectAccessReview (a POST without side effects) with the proxy's own
        identity on a pooled exchange connection: (status, body); None through an http(s)/socks
        proxy, where the caller uses ``session``. aiohttp's POST cost ~30% of the proxy's CPU in a
        burst of kubelets, whose every request needs a review (docs/performance.md)."""
        if self.exchanges is None:
            return None
        return await self._own_get(path, headers, method="POST", body=body)

    def url(self, path: str) -> str:
        return self.config.server + path

    def _own(self) -> aiohttp.ClientSession:
        assert self.session is not None, "UpstreamClient.start() not called"
        return self.session

    async def get_json(self, path: str, params: Mapping[str, str] | None = None, timeout: float = 30.0) -> Any:
        return orjson.loads(await self.get_bytes(path, params, timeout))

    async def get_bytes(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        *,
        accept: str = "application/json",
    ) -> bytes:
        """A GET's body (raises UpstreamError for a non-200 answer; a 401 tells the credentials).

        On a pooled exchange connection when there is no proxy in the way: the consistent reads'
        proofs are such GETs, one per consistent LIST, and aiohttp's client cost more CPU than the
        rest of the proof (``upstream/exchange.py``). No ``Accept-Encoding``: the proxy's reads are
        small, or large ones on a fast network, where gzip costs both ends more CPU than it saves.
        """
        credential = await self.tokens.fresh_headers()
        if self.exchanges is not None:
            target = path + ("?" + urlencode(params) if params else "")
            async with asyncio.timeout(timeout):
                status, body = await self._own_get(target, {"Accept": accept, **credential})
            if status != 200:
                if status == 401:
                    self.tokens.rejected(credential)
                raise _error_from_body(status, body)
            return body
        async with self._own().get(
            self.url(path),
            params=params,
            headers={"Accept": accept, **credential},
            timeout=aiohttp.ClientTimeout(total=timeout),
            server_hostname=self.config.tls_server_name,
        ) as resp:
            if resp.status != 200:
                if resp.status == 401:
                    self.tokens.rejected(credential)
                raise await _error_from(resp)
            return await resp.read()

    async def list_rv(self, resource: ResourceType) -> int:
        """The upstream's current resourceVersion: a consistent (quorum) LIST of one item."""
        data = await self.get_json(collection_path(resource), {"limit": "1"}, timeout=10.0)
        return int(data["metadata"]["resourceVersion"])

    async def list_versions(self, resource: ResourceType, namespace: str | None, timeout: float = 10.0) -> ScopeState:
        """A consistent LIST of a scope's metadata only: how many objects, and the newest one's rv,
        at the upstream's rv (``cache/scopestate.py``).

        In protobuf, as kube's own components read metadata: kube encodes it several times
        faster than JSON, and the proxy decodes it in C (docs/consistency.md).
        """
        body = await self.get_bytes(collection_path(resource, namespace), None, timeout, accept=METADATA_LIST_PROTOBUF)
        return ScopeState(*scope_summary(body))

    async def watch_into(
        self,
        resource: ResourceType,
        params: Mapping[str, str],
        on_lines: Callable[[list[bytes]], None],
        *,
        stall_timeout: float,
        connect_timeout: float = 10.0,
        accept: str = "application/json",
        split: Splitter = split_lines,
    ) -> None:
        """Run one watch stream: each network read's complete event lines go to ``on_lines`` at once.

        ``accept`` and ``split``: another encoding's stream and how it is cut into events
        (protobuf: ``objects.split_frames``, length-prefixed frames instead of lines).

        Returns when the upstream ends the stream. Raises ``WatchStalled`` if nothing arrives for
        ``stall_timeout`` seconds, ``UpstreamError`` for a non-200 answer (a 401 tells the
        credentials, as ``get_bytes``), ``OSError`` if the connection fails or is lost,
        ``TimeoutError`` if it is not made in ``connect_timeout``, and whatever ``on_lines`` raises
        (the stream is closed then).
        """
        url = urlsplit(self.url(collection_path(resource)))
        query = urlencode({"watch": "1", **params})
        default_port = 443 if url.scheme == "https" else 80
        port = url.port or default_port
        host = url.hostname or ""
        credential = await self.tokens.fresh_headers()
        headers = {
            "Host": url.netloc if url.port and url.port != default_port else host,
            "User-Agent": USER_AGENT,
            "Accept": accept,
            **credential,
        }
        request = (
            f"GET {url.path}?{query} HTTP/1.1\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
            + b"\r\n"
        )
        stream = _WatchStream(request, on_lines, stall_timeout, split)
        ssl_context = self.own_ssl if url.scheme == "https" else None
        server_hostname = (self.config.tls_server_name or host) if ssl_context is not None else None
        self.watch_streams.add(stream)
        try:
            try:
                async with asyncio.timeout(connect_timeout):
                    await open_connection(
                        self.config,
                        lambda: stream,
                        host,
                        port,
                        ssl_context=ssl_context,
                        server_hostname=server_hostname,
                    )
            except TimeoutError:
                raise TimeoutError(f"connecting to {url.netloc} timed out after {connect_timeout:.0f}s") from None
            try:
                await stream.done
            except UpstreamError as e:
                if e.code == 401:
                    self.tokens.rejected(credential)
                raise
        finally:
            self.watch_streams.discard(stream)
            stream.close()

    async def watch(
        self,
        resource: ResourceType,
        params: Mapping[str, str],
        *,
        stall_timeout: float,
        accept: str = "application/json",
        split: Splitter = split_lines,
    ) -> AsyncGenerator[list[bytes], None]:
        """Yield the complete event lines of a watch stream, a batch per network read.

        Raises WatchStalled if nothing arrives for ``stall_timeout`` seconds, UpstreamError
        for a non-200 answer. Lines are split here (aiohttp's readline caps line length far
        below the size of large objects); ``accept``/``split`` as ``watch_into``'s.
        """
        credential = await self.tokens.fresh_headers()
        async with self._own().get(
            self.url(collection_path(resource)),
            params={"watch": "1", **params},
            headers={"Accept": accept, **credential},
            server_hostname=self.config.tls_server_name,
        ) as resp:
            if resp.status != 200:
                if resp.status == 401:
                    self.tokens.rejected(credential)
                raise await _error_from(resp)
            pending = b""
            while True:
                try:
                    async with asyncio.timeout(stall_timeout):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    raise WatchStalled(f"no data for {stall_timeout:.0f}s") from None
                if not chunk:
                    return
                data = pending + chunk if pending else chunk
                lines, pending = split(data)
                if lines:
                    yield lines

"""A TLS relay in front of the proxy that logs every request it forwards: what the proxy served, and to whom.

clients --TLS--> relay --TLS--> proxy. The relay terminates TLS with the proxy's own serving
certificate (so clients' kubeconfigs are unchanged but for the port), parses the client-to-proxy
direction with httptools (method, target, User-Agent) and forwards bytes untouched both ways. It
stays up while the proxy behind it restarts: a connection whose proxy side breaks is closed, and
the client reconnects to the relay, which dials the new proxy — as a load balancer would.

``relists`` reads the log the way issue 20 counts relists: after a given time, an informer that
was already watching lists again — a LIST of the collection it watches (not a continue page),
whatever its ``resourceVersion`` (after a 410 client-go's reflector relists *with* the last rv it
saw, ``NotOlderThan``), or a watch with ``sendInitialEvents=true`` (a WatchList informer's list).
An informer is a (client, collection, selectors) that watched before that time: a controller's
one-off LIST of a collection nobody watches (the namespace controller checking that a namespace
it deletes is empty) is not a relist.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import httptools

INITIAL_EVENTS_END = b"k8s.io/initial-events-end"


@dataclass
class Logged:
    at: float  # time.monotonic()
    method: str
    target: str
    user_agent: str
    # When the client had what it asked for: a LIST's whole response, a watch-list's
    # initial-events-end bookmark; None for a plain watch, or not yet.
    done: float | None = None
    status: int = 0  # the response's status code (0: none came: the connection was closed first)

    @property
    def watch_list(self) -> bool:
        return "sendInitialEvents=true" in self.target


class _Parser:
    """The client-to-proxy direction: one ``Logged`` per request head, queued on its connection."""

    def __init__(self, log: list[Logged]) -> None:
        self.log = log
        self.url = b""
        self.agent = b""
        self.pending: list[Logged] = []  # this connection's requests without their answer yet
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.url, self.agent = b"", b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"user-agent":
            self.agent = value

    def on_headers_complete(self) -> None:
        # Logged at the head: a watch's request never "completes" from the relay's point of view.
        method = self.parser.get_method().decode()
        entry = Logged(time.monotonic(), method, self.url.decode("latin-1"), self.agent.decode("latin-1"))
        self.log.append(entry)
        self.pending.append(entry)


class _Answers:
    """The proxy-to-client direction: when each request of the connection was answered."""

    def __init__(self, requests: _Parser, log: RequestLog) -> None:
        self.requests = requests
        self.log = log
        self.parser = httptools.HttpResponseParser(self)
        self.tail = b""

    def on_headers_complete(self) -> None:
        for entry in self.requests.pending:
            if not entry.status:
                entry.status = self.parser.get_status_code()
                break

    def on_message_complete(self) -> None:
        if self.requests.pending:
            entry = self.requests.pending.pop(0)
            if entry.done is None:
                entry.done = time.monotonic()

    def feed(self, data: bytes) -> None:
        self.log.received += len(data)
        pending = self.requests.pending
        if pending and pending[0].watch_list and pending[0].done is None:
            if INITIAL_EVENTS_END in self.tail + data:
                pending[0].done = time.monotonic()
            self.tail = data[-len(INITIAL_EVENTS_END) :]
        with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.parser.feed_data(data)


@dataclass
class RequestLog:
    """The relay, on its own thread and event loop; ``requests`` grows as clients send."""

    target: tuple[str, int]
    server_ssl: ssl.SSLContext
    client_ssl: ssl.SSLContext
    requests: list[Logged] = field(default_factory=list)
    port: int = 0
    received: int = 0  # bytes the target sent back (response heads and bodies)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.server_ssl)
            )
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="request-log")
        self._thread.start()
        assert ready.wait(10), "the relay did not start"
        return self.port

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target, ssl=self.client_ssl, server_hostname="127.0.0.1")
        except OSError:
            client_w.close()
            return
        parser = _Parser(self.requests)
        await asyncio.gather(_pipe(client_r, up_w, parser), _pipe(up_r, client_w, _Answers(parser, self)))

    def since(self, t: float) -> list[Logged]:
        return [r for r in list(self.requests) if r.at >= t]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: _Parser | _Answers) -> None:
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if isinstance(parser, _Answers):
                parser.feed(data)
            else:
                with contextlib.suppress(httptools.HttpParserError):
                    parser.parser.feed_data(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def collection_of(path: str) -> str | None:
    """The collection a request path names (``pods``, ``ns/pods``...), or None for an object, a
    subresource or a non-resource path."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return None
    if len(rest) >= 3 and rest[0] == "namespaces":
        return f"{rest[1]}/{rest[2]}" if len(rest) == 3 else None
    return rest[0] if len(rest) == 1 else None


Informer = tuple[str, str, str, str]  # client, path, labelSelector, fieldSelector


def _parse(request: Logged) -> tuple[Informer, dict[str, str]] | None:
    """The informer a GET of a collection belongs to, and its query; None for anything else."""
    parts = urlsplit(request.target)
    if request.method != "GET" or collection_of(parts.path) is None:
        return None
    q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    client = request.user_agent.split(" ")[0]
    return (client, parts.path, q.get("labelSelector", ""), q.get("fieldSelector", "")), q


def _is_watch(q: dict[str, str]) -> bool:
    return q.get("watch") in ("1", "true")


def informers(log: RequestLog, until: float) -> set[Informer]:
    """Every (client, collection, selectors) that watched before ``until``."""
    out = set()
    for r in list(log.requests):
        parsed = _parse(r)
        if r.at < until and parsed is not None and _is_watch(parsed[1]):
            out.add(parsed[0])
    return out


def relists(log: RequestLog, since: float) -> list[str]:
    """The lists (LIST, not a continue page; or a watch-list) after ``since`` of informers watching before it."""
    known = informers(log, since)
    out = []
    for r in log.since(since):
        parsed = _parse(r)
        if parsed is None or parsed[0] not in known:
            continue
        q = parsed[1]
        if (q.get("sendInitialEvents") == "true") if _is_watch(q) else "continue" not in q:
            out.append(f"{parsed[0][0]}: {r.method} {r.target}")
    return out


def watches(log: RequestLog, since: float) -> set[Informer]:
    """The informers that sent a watch request after ``since``."""
    out = set()
    for r in log.since(since):
        parsed = _parse(r)
        if parsed is not None and _is_watch(parsed[1]):
            out.add(parsed[0])
    return out

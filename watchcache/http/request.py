"""The request a handler is given, whatever the wire, and what both protocols share to make one.

HTTP/1.1 (:mod:`watchcache.http.h1protocol`) and HTTP/2 (:mod:`watchcache.http.h2protocol`) each
turn their bytes into the same :class:`Request` and hand it to the same :data:`Handler`, which
answers through a :class:`~watchcache.http.response.Response`; so cached reads, watches,
pass-through and errors are written once. As uvicorn's protocols share ``protocols/utils.py``,
what both need to build a request lives here, and neither protocol module imports the other:
how a request target is decoded (:func:`split_target`), who the peer is (:func:`peer_identity`),
and which requests are health probes, admitted over the request-buffer limit (:func:`is_probe`).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, unquote_to_bytes

import httptools

from watchcache.http.response import Response

__all__ = [
    "PROBES",
    "PROBE_MAX_HEAD",
    "Admit",
    "Admitted",
    "Handler",
    "Prestart",
    "Request",
    "is_probe",
    "new_audit_id",
    "origin_form",
    "parse_query",
    "peer_identity",
    "split_target",
]

#: Probes answered even when the request buffer is full: a liveness probe must not fail
#: because of other clients' bodies (small body-less requests only).
PROBES = frozenset({b"/healthz", b"/livez", b"/readyz"})
PROBE_MAX_HEAD = 8192


@dataclass(slots=True)
class Request:
    method: str
    raw_path: bytes
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    http_version: str
    remote: str
    # The verified client certificate of a TLS connection (``SSLObject.getpeercert()``), if any,
    # plus ``x509sha256``: the hex SHA-256 of its DER encoding.
    peercert: dict[str, Any] | None = None
    # The protocol an upgrade request asks for (``Connection: Upgrade`` + ``Upgrade: websocket``),
    # else None. Its answer is either ``Response.switch_protocols`` or a response after which the
    # connection closes (the bytes after its head belong to the protocol it asked for).
    upgrade: str | None = None
    # Headers sent on more than one line: their values, one per line (``headers`` joins them
    # with ", " for lookups). None when no header was repeated, as in almost every request.
    repeated: dict[str, list[str]] | None = None
    # Set while handling: the connection must not serve another request after this one. On HTTP/2
    # (kube's UnauthenticatedHTTP2DOSMitigation) a GOAWAY follows the answer, so that a client
    # nobody authenticated cannot multiplex; HTTP/1.1 has one request at a time anyway.
    close_connection: bool = False
    # What the handler's ``Admit`` granted this request at the end of its head, before its body
    # was read (None: the request was not admitted before its handler, which admits it itself).
    admitted: Admitted | None = None
    # What ``Prestart`` started for this request: a GET sent to the upstream as it arrived
    # (``server/passthrough.py``'s ``Early``), which the handler takes or discards.
    early: object | None = None
    # False when a query key or value is not UTF-8 once unescaped: ``query`` holds it with U+FFFD
    # where kube reads the bytes, so only the upstream answers it as kube does (passed through).
    query_utf8: bool = True

    def header_lines(self) -> list[tuple[str, str]]:
        """Every header as received, one (name, value) per line: a repeated header stays repeated.

        For forwarding: kube-apiserver reads each ``Impersonate-Group`` line as one group, so
        the lines ``a`` and ``b`` must not become the single line ``a, b``.
        """
        repeated = self.repeated
        if not repeated:
            return list(self.headers.items())
        lines: list[tuple[str, str]] = []
        for name, value in self.headers.items():
            values = repeated.get(name)
            if values is None:
                lines.append((name, value))
            else:
                lines.extend((name, v) for v in values)
        return lines

    def audit_id(self) -> str:
        """The ``Audit-ID`` the client sent (its first line's, as Go's ``Header.Get``), or "": kube-apiserver's
        first filter (``WithAuditInit``) answers every request with it as ``Audit-Id``, or with a new UUID
        (``new_audit_id``). A value no header line may carry (a CR, LF or NUL, which the parser lets
        through nowhere) counts as none, so the answer's head is always writable."""
        value = self.headers.get("audit-id")
        if not value:
            return ""
        if self.repeated is not None:
            value = self.repeated.get("audit-id", (value,))[0]
        if "\r" in value or "\n" in value or "\x00" in value:
            return ""
        return value

    def query_value(self, name: str) -> str | None:
        """First value of a query parameter, as most list/watch options are single-valued."""
        values = self.query.get(name)
        return values[0] if values else None


def new_audit_id() -> str:
    """An answer's ``Audit-Id`` where the client sent none: a random UUID, as kube's ``uuid.New()``.
    Made as the head is written, so a passed-through answer (which has the upstream's) costs none."""
    return str(uuid.uuid4())


class Admitted(Protocol):
    """A request's seat, granted before its body was read; ``release`` (idempotent) gives it back."""

    def release(self) -> None: ...


#: What answers a request: cached reads, watches, pass-through (``server.app.ApiHandler``).
Handler = Callable[[Request, Response], Awaitable[None]]

#: The handler's admission of a request whose body is still to come (``ApiHandler.admit``), called at
#: the end of its head, before any of its body is read: kube-apiserver's flow control waits before
#: its handlers read a body, so a queued request holds its head and no more. The request's grant
#: (then its body is read and the handler runs with ``request.admitted`` set), or None once the
#: request is answered (a 429) through the response given: its body is never read.
Admit = Callable[[Request, Response], Awaitable[Admitted | None]]

#: Called with a request complete without a body and its handler's task, made and not yet run
#: (``ApiHandler.prestart``): what may start a loop iteration sooner than the handler's first step (a
#: consistent GET sent to the upstream while flow control does its work). The task is for settling what
#: was started when the handler never runs (an HTTP/2 stream reset at once cancels its task before its
#: first step, so no ``finally`` of the handler's runs). Must not raise, block or answer the request.
Prestart = Callable[[Request, asyncio.Task[None]], None]


def origin_form(raw: bytes) -> bytes:
    """The origin form (path and query) of a request target; an absolute-form target
    (``http://host/path?q``, which servers must accept: RFC 9112 3.2.2) is routed and forwarded
    on it, as Go routes on the parsed URL. ``*`` and origin forms are returned as they are.
    ValueError -> 400."""
    if raw[:1] == b"/" or raw == b"*":
        return raw
    try:
        url = httptools.parse_url(raw)
    except httptools.HttpParserInvalidURLError:
        raise ValueError("invalid URL") from None
    if not url.schema:
        raise ValueError("invalid request target")
    path = url.path or b"/"
    return path + b"?" + url.query if url.query else path


def split_target(raw: bytes) -> tuple[str, dict[str, list[str]], bool]:
    """Decoded path and query of a request target, and whether the query is UTF-8 (``parse_query``).
    The path is for display and the proxy's own endpoints: an escape or byte that is not UTF-8 is
    U+FFFD in it (routing reads the raw path, ``http/routing.py``). ValueError -> 400."""
    if raw[:1] == b"/":
        path_b, _, query_b = raw.partition(b"?")
    elif raw == b"*":
        return "*", {}, True
    else:  # absolute-form, which servers must accept (RFC 9112 3.2.2)
        try:
            url = httptools.parse_url(raw)
        except httptools.HttpParserInvalidURLError:
            raise ValueError("invalid URL") from None
        path_b, query_b = url.path or b"/", url.query or b""
    path = unquote(path_b.decode("utf-8", "replace"), errors="replace")
    if not query_b:
        return path, {}, True
    query, utf8 = parse_query(query_b)
    return path, query, utf8


#: Go's ``url.ParseQuery`` ignores the whole query past this many ``&``-separated parts (its
#: ``defaultMaxParams``, the ``urlmaxqueryparams`` GODEBUG): kube-apiserver then sees no parameter at
#: all (the kit's v1.36: ``?limit=1`` and 10,000 ``&`` lists everything, 9,998 ``&`` one item).
GO_MAX_QUERY_PARAMS = 10000
# A '%' not followed by two hex digits: Go's QueryUnescape fails on it, and ParseQuery drops the pair.
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def parse_query(query: bytes) -> tuple[dict[str, list[str]], bool]:
    """A query as Go's ``url.ParseQuery`` reads it (kube-apiserver's ``req.URL.Query()``, its error
    ignored), and whether every key and value is UTF-8.

    Pairs are split on ``&`` only; a pair holding a ``;`` is dropped (Go 1.17+), as is one whose key
    or value has a bad escape (``%zz``, a trailing ``%4``); ``+`` is a space; an empty pair is
    skipped, a pair without ``=`` has the empty value. Go's values are bytes: one that is not UTF-8
    is returned with U+FFFD and ``False``, for the caller to pass the request through. Python's
    ``parse_qs`` differs on each of these (it keeps ``;`` and bad escapes, and must decode), so a
    ``?labelSelector=%zz`` that kube lists unfiltered would be a 400 here.
    """
    if query.count(b"&") >= GO_MAX_QUERY_PARAMS:
        return {}, True
    if query.isascii() and b";" not in query and (b"%" not in query or _BAD_ESCAPE.search(query) is None):
        # Every query a client library writes: no pair to drop, and (unless an escape is not UTF-8)
        # read as text: 2.5 µs for ``limit=500&resourceVersion=0&labelSelector=app%3Dweb`` (parse_qs: 4.4).
        try:
            return _text_query(query.decode("ascii")), True
        except UnicodeDecodeError:
            pass
    return _bytes_query(query)


def _text_query(query: str) -> dict[str, list[str]]:
    """``parse_query`` of an ASCII query with no pair to drop; UnicodeDecodeError for an escape
    that is not UTF-8."""
    out: dict[str, list[str]] = {}
    for pair in query.split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        if "+" in key:
            key = key.replace("+", " ")
        if "%" in key:
            key = unquote(key, errors="strict")
        if "+" in value:
            value = value.replace("+", " ")
        if "%" in value:
            value = unquote(value, errors="strict")
        values = out.get(key)
        if values is None:
            out[key] = [value]
        else:
            values.append(value)
    return out


def _bytes_query(query: bytes) -> tuple[dict[str, list[str]], bool]:
    """``parse_query`` of any query: Go's pairs as bytes, then text (U+FFFD where not UTF-8)."""
    out: dict[str, list[str]] = {}
    utf8 = True
    for pair in query.split(b"&"):
        if not pair or b";" in pair or (b"%" in pair and _BAD_ESCAPE.search(pair) is not None):
            continue
        key_b, _, value_b = pair.replace(b"+", b" ").partition(b"=")
        key_b, value_b = unquote_to_bytes(key_b), unquote_to_bytes(value_b)
        try:
            key, value = key_b.decode("utf-8"), value_b.decode("utf-8")
        except UnicodeDecodeError:
            key, value = key_b.decode("utf-8", "replace"), value_b.decode("utf-8", "replace")
            utf8 = False
        out.setdefault(key, []).append(value)
    return out, utf8


def is_probe(target: bytes, head_bytes: int, has_body: bool) -> bool:
    """A small body-less health probe (:data:`PROBES`), admitted over the request buffer limit."""
    return head_bytes <= PROBE_MAX_HEAD and not has_body and target.partition(b"?")[0] in PROBES


def peer_identity(transport: asyncio.BaseTransport) -> tuple[str, str, dict[str, Any] | None]:
    """The peer's ``host:port`` (for logs and X-Forwarded-For), its host (the per-client limit),
    and its verified client certificate with ``x509sha256`` (kube's credential id of a certificate
    user: the SHA-256 of its DER)."""
    peer = transport.get_extra_info("peername")
    host = remote = ""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = peer[0]
        remote = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    peercert = transport.get_extra_info("peercert") or None
    ssl_object = transport.get_extra_info("ssl_object") if peercert else None
    if peercert and ssl_object is not None:
        peercert = {**peercert, "x509sha256": hashlib.sha256(ssl_object.getpeercert(True)).hexdigest()}
    return remote, host, peercert

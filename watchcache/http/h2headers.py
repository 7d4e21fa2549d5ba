"""An HTTP/2 request's HEADERS block, checked as Go's net/http2 checks it, into what a ``Request`` needs.

RFC 9113 8.1-8.3, and what kube-apiserver (Go) answers: a malformed block raises ``ValueError``,
which ``h2protocol`` turns into RST_STREAM PROTOCOL_ERROR (a stream error, never the connection's);
a well-formed one that is refused raises :class:`Refused`, answered with kube's ``Status`` (431 over
``--max-header-bytes``, 400 for connection-specific headers, ``TE`` other than ``trailers``,
CONNECT or a bad target, 413 over ``--max-body-bytes``). No state of a connection here: its own
limits (the per-client refusal, the request buffer) stay in ``h2protocol``, checked between
:func:`read_fields` and :func:`read_target` in the order Go checks them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from watchcache import apierrors
from watchcache.http.h2stream import CONNECTION_SPECIFIC
from watchcache.http.limits import HttpLimits
from watchcache.http.request import split_target

REQUIRED = (b":method", b":scheme", b":path")
# Go's httpguts, as its HTTP/2 framer applies them to every field (RFC 9113 8.2.1): a name is
# lower-case token characters; a value has no control character but HTAB (bytes >= 0x80 are fine).
_BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9a-z]")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_NEEDS_HTTP1 = " (connection upgrades -- exec, attach, port-forward -- need HTTP/1.1)"


class Refused(Exception):
    """A stream answered with a Status before its handler runs (431, 400, 413, 429, 408);
    ``limit``: the ``Admission.rejected`` key it counts under, if any."""

    def __init__(self, error: apierrors.StatusError, limit: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.limit = limit


def too_large_body(limit: int) -> apierrors.StatusError:
    return apierrors.StatusError(413, "RequestEntityTooLarge", f"request body exceeds the limit of {limit} bytes")


def too_much_buffered() -> apierrors.StatusError:
    return apierrors.too_many_requests("too many request bytes waiting to be answered, please try again later", 1)


@dataclass(slots=True)
class Fields:
    """The header fields of one HEADERS block, checked."""

    pseudo: dict[bytes, bytes]
    headers: dict[str, str]  # repeated lines joined (", ", or "; " for cookie crumbs)
    repeated: dict[str, list[str]] | None  # each line of a repeated header, when there is one
    size: int  # as HPACK counts a header list (RFC 9113 6.5.2): name + value + 32 per field

    @property
    def method(self) -> str:
        return self.pseudo[b":method"].decode("latin-1")


@dataclass(slots=True)
class Target:
    raw: bytes
    path: str
    query: dict[str, list[str]]
    length: int  # the announced Content-Length (0 without one)
    query_utf8: bool = True  # ``Request.query_utf8``


def read_fields(fields: list[tuple[bytes, bytes]], limits: HttpLimits) -> Fields:
    """The block's fields; ValueError if malformed, Refused if refused."""
    pseudo: dict[bytes, bytes] = {}
    headers: dict[str, str] = {}
    repeated: dict[str, list[str]] | None = None
    size = 0
    for name, value in fields:
        size += len(name) + len(value) + 32
        if _BAD_VALUE.search(value) is not None:
            raise ValueError("invalid header value")
        if name[:1] == b":":
            if headers or name in pseudo or name not in (b":method", b":scheme", b":path", b":authority"):
                raise ValueError("invalid pseudo-header")
            pseudo[name] = value
            continue
        if not name or _BAD_NAME.search(name) is not None:
            raise ValueError("invalid header name")
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        old = headers.get(key)
        if old is None:
            headers[key] = text
        elif key == "cookie":  # RFC 9113 8.2.3: cookie crumbs join with "; "
            headers[key] = f"{old}; {text}"
        else:
            headers[key] = f"{old}, {text}"
            if repeated is None:
                repeated = {}
            repeated.setdefault(key, [old]).append(text)
    if size > limits.max_header_bytes:
        raise Refused(
            apierrors.StatusError(431, "RequestHeaderFieldsTooLarge", "request header fields too large"),
            "http2_header_list",
        )
    for key in CONNECTION_SPECIFIC:
        if key in headers:
            upgrade = _NEEDS_HTTP1 if key in ("connection", "upgrade") else ""
            raise Refused(
                apierrors.bad_request(f'request header "{key}" is not valid in HTTP/2{upgrade}'), "http2_upgrade"
            )
    te = headers.get("te")
    if te is not None and te not in ("trailers", ""):
        raise Refused(apierrors.bad_request('request header "TE" may only be "trailers" in HTTP/2'))
    if pseudo.get(b":method") == b"CONNECT":
        raise Refused(apierrors.bad_request("the CONNECT method is not supported"), "http2_upgrade")
    if any(not pseudo.get(name) for name in REQUIRED):
        raise ValueError("missing pseudo-header")
    return Fields(pseudo, headers, repeated, size)


def read_target(fields: Fields, limits: HttpLimits) -> Target:
    """The request target and the body it announces; ValueError if malformed, Refused if refused.
    Adds ``host`` from ``:authority`` when the client sent no Host header."""
    raw = fields.pseudo[b":path"]
    if raw[:1] != b"/" and raw != b"*":
        raise ValueError("invalid :path")  # origin-form or `*` only (RFC 9113 8.3.1), as Go's validPseudoPath
    try:
        path, query, query_utf8 = split_target(raw)
    except ValueError:
        raise Refused(apierrors.bad_request("invalid request target")) from None
    headers, repeated = fields.headers, fields.repeated
    length = 0
    length_text = headers.get("content-length")
    if length_text is not None:
        # One value, digits only (repeated lines must agree): else malformed, a stream error.
        values = set(repeated.get("content-length", ())) if repeated else {length_text}
        if len(values) != 1 or not length_text.isdigit() or not length_text.isascii():
            raise ValueError("invalid content-length")
        length = int(length_text)
    if length > limits.max_body_bytes:
        raise Refused(too_large_body(limits.max_body_bytes), None)
    if "host" not in headers and b":authority" in fields.pseudo:
        headers["host"] = fields.pseudo[b":authority"].decode("latin-1")
    return Target(raw, path, query, length, query_utf8)

"""Continue tokens: where the next page of a chunked LIST starts, and at which rv (invariant 4).

The payload is kube-apiserver's (``{"v":"meta.k8s.io/v1","rv":N,"start":"key\\x00"}``,
base64url) with the start key relative to the list's scope, plus an HMAC so that a
client cannot forge a token that reads outside its list or at an rv it never saw.
The key is per deployment (shared by all workers and replicas), so a token minted by
one worker is honoured by every other.

When the list's rv is shared by several events (a group from an upstream watch cache,
see ``ResourceCache``), the token also carries the group's size (``n``): the rest of a
group split across two reads may arrive between two pages, and a page must then not read
a state the first page did not (``ResourceCache.group_size``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import posixpath
import re
from typing import Any

import orjson

from watchcache.godecode import (
    GoDecodeError,
    JsonNumber,
    JsonObject,
    check_json,
    go_type,
    loads,
    raw_url_b64decode,
    without_surrogates,
)

TOKEN_VERSION = "meta.k8s.io/v1"


class InvalidContinueToken(ValueError):
    pass


class UnverifiedContinueToken(InvalidContinueToken):
    """A well-formed token this key did not sign: forged, or issued by another server (the upstream)."""


class ContinueCodec:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("continue-token key must be at least 16 bytes")
        self._secret = secret

    def _mac(self, rv: int, start: str, group: int = 0) -> str:
        msg = f"{TOKEN_VERSION}\n{rv}\n{start}" + (f"\n{group}" if group > 1 else "")
        return hmac.new(self._secret, msg.encode(), hashlib.sha256).hexdigest()[:32]

    def encode(self, rv: int, start: str, group: int = 0) -> str:
        """``group``: how many events share ``rv`` (kept only when several do)."""
        payload: dict[str, object] = {"v": TOKEN_VERSION, "rv": rv, "start": start}
        if group > 1:
            payload["n"] = group
        payload["sig"] = self._mac(rv, start, group)
        return base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=").decode()

    def decode(self, token: str) -> tuple[int, str]:
        """(rv, start key relative to the scope); InvalidContinueToken with kube's wording otherwise."""
        rv, start, _ = self.decode_with_group(token)
        return rv, start

    def decode_with_group(self, token: str) -> tuple[int, str, int]:
        """(rv, start key, the size of the group at rv when the token was minted: 1 if not several).

        kube's checks first, with kube's words (``decode_as_kube``): a token kube-apiserver would refuse
        gets kube's answer. Then this server's own: a token it did not sign is UnverifiedContinueToken
        (the upstream's own, passed through by a proxy, or a forgery).
        """
        rv, start, extras = decode_as_kube(token)
        group = _int(extras.get("n", JsonNumber("1")))
        sig = extras.get("sig")
        if (
            rv <= 0
            or group is None
            or group < 1
            or not isinstance(sig, str)
            or not hmac.compare_digest(sig, self._mac(rv, start, group))
        ):
            raise UnverifiedContinueToken("continue key is not valid: signature mismatch")
        return rv, start, group


# continueToken's fields as Go's struct declares them: JSON name, Go type.
_FIELDS = {"v": "string", "rv": "int64", "start": "string"}
_INT64 = re.compile(r"-?[0-9]+")


def decode_as_kube(token: str) -> tuple[int, str, dict[str, Any]]:
    """``storage.DecodeContinue``: (rv, start key, the other fields by name) or InvalidContinueToken in
    kube's words (``continue key is not valid: ...``, Go's decoding errors included: ``godecode``)."""
    try:
        data = raw_url_b64decode(token.encode("utf-8", "surrogateescape"))
        check_json(data)
    except GoDecodeError as e:
        raise InvalidContinueToken(f"continue key is not valid: {e}") from None
    try:
        doc = loads(data)
    except RecursionError:  # nesting Go takes (up to 10,000 deep) and Python's parser does not
        raise InvalidContinueToken("continue key is not valid") from None
    fields, extras = _unmarshal(doc)
    version, rv, start = fields["v"], fields["rv"], fields["start"]
    if version != TOKEN_VERSION:
        raise InvalidContinueToken(
            f"continue key is not valid: server does not recognize this encoded version {version}"
        )
    if rv == 0:
        raise InvalidContinueToken(
            f"continue key is not valid: incorrect encoded start resourceVersion (version {TOKEN_VERSION})"
        )
    if not start:
        raise InvalidContinueToken(f"continue key is not valid: encoded start key empty (version {TOKEN_VERSION})")
    # kube's path-traversal defence: the key must already be in clean form (Go's path.Clean).
    key = start if start.startswith("/") else "/" + start
    cleaned = posixpath.normpath(key)
    if cleaned.startswith("//"):  # POSIX keeps two leading slashes; Go's Clean does not
        cleaned = "/" + cleaned.lstrip("/")
    if cleaned != key:
        raise InvalidContinueToken(f"continue key is not valid: {start}")
    return rv, start, extras


def _unmarshal(doc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``json.Unmarshal`` into kube's ``continueToken``: its fields (zero values where absent or null) and
    the others by name; the first type error in document order, in Go's words."""
    fields: dict[str, Any] = {"v": "", "rv": 0, "start": ""}
    extras: dict[str, Any] = {}
    if doc is None:
        return fields, extras
    if not isinstance(doc, JsonObject):
        raise InvalidContinueToken(
            f"continue key is not valid: json: cannot unmarshal {go_type(doc)} into Go value of type "
            "storage.continueToken"
        )
    error: str | None = None
    for key, value in doc:
        extras[key] = value
        name = key if key in _FIELDS else next((f for f in _FIELDS if f == key.lower()), None)
        if name is None or value is None:
            continue
        kind = _FIELDS[name]
        if kind == "string" and isinstance(value, str) and not isinstance(value, JsonNumber):
            fields[name] = without_surrogates(value)
            continue
        if kind == "int64" and isinstance(value, JsonNumber) and (n := _int(value)) is not None:
            fields[name] = n
            continue
        got = go_type(value)
        if kind == "int64" and got == "number":
            got = f"number {value}"
        error = error or f"json: cannot unmarshal {got} into Go struct field continueToken.{name} of type {kind}"
    if error is not None:
        raise InvalidContinueToken(f"continue key is not valid: {error}")
    return fields, extras


def _int(value: Any) -> int | None:
    """``strconv.ParseInt(value, 10, 64)`` of a JSON number's text; None if it is not an int64."""
    if not isinstance(value, JsonNumber) or not _INT64.fullmatch(value):
        return None
    n = int(value)
    return n if -(1 << 63) <= n < (1 << 63) else None

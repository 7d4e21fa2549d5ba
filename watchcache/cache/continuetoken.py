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
import binascii
import hashlib
import hmac
import posixpath

import orjson

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
        """(rv, start key, the size of the group at rv when the token was minted: 1 if not several)."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            payload = orjson.loads(raw)
        except (binascii.Error, ValueError, orjson.JSONDecodeError) as e:
            raise InvalidContinueToken(f"continue key is not valid: {e}") from None
        if not isinstance(payload, dict) or payload.get("v") != TOKEN_VERSION:
            raise InvalidContinueToken(
                f"continue key is not valid: incorrect encoded start resourceVersion (version {TOKEN_VERSION})"
            )
        rv, start, sig = payload.get("rv"), payload.get("start"), payload.get("sig")
        if not isinstance(rv, int) or isinstance(rv, bool) or rv <= 0:
            raise InvalidContinueToken("continue key is not valid: incorrect encoded start resourceVersion")
        if not isinstance(start, str) or not start:
            raise InvalidContinueToken("continue key is not valid: encoded start key empty")
        # kube's path-traversal defence: the key must already be in clean form.
        key = start if start.startswith("/") else "/" + start
        if posixpath.normpath(key) != key or "//" in key:
            raise InvalidContinueToken(f"continue key is not valid: {start}")
        group = payload.get("n", 1)
        if not isinstance(group, int) or isinstance(group, bool) or group < 1:
            raise InvalidContinueToken("continue key is not valid: incorrect group size")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, self._mac(rv, start, group)):
            raise UnverifiedContinueToken("continue key is not valid: signature mismatch")
        return rv, start, group

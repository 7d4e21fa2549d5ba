"""The request-header (front-proxy) convention: a trusted proxy tells the apiserver who the user is.

kube-apiserver's aggregation layer forwards a request to an extension apiserver with its
front-proxy client certificate and the user in headers (client-go's ``SetAuthProxyHeaders``):
``X-Remote-User: name``, one ``X-Remote-Group`` line per group, one ``X-Remote-Extra-<key>``
line per extra value (the key percent-encoded where a header name cannot carry it). The
receiving apiserver believes those headers only on a connection whose client certificate
chains to its ``--requestheader-client-ca-file`` and whose CN is in
``--requestheader-allowed-names``; the names it reads are its ``--requestheader-*-headers``
flags, published in ``kube-system/extension-apiserver-authentication``.

watchcache uses it in both directions:

- as a client: the pass-through of a client-certificate user presents watchcache's
  front-proxy certificate and these headers (``watchcache.upstream.identity``);
- as the simulated cluster's authenticator (``RequestHeaderAuthenticator``), so the same
  path can be tested end to end without a real apiserver.

Whatever the mode, these headers from a client are never forwarded (``is_identity_header``):
on a connection that presents the front-proxy certificate they would let a client speak for
anyone.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from watchcache.auth.authn import UserInfo, distinguished_name, with_authenticated_group

# RFC 9110 token characters: what a header name may carry unescaped (``%`` always escaped).
_TCHAR = frozenset(b"!#$&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# Whatever the configuration: no client has a reason to send these to a Kubernetes API.
_ALWAYS_STRIPPED_PREFIX = "x-remote-"


def escape_extra_key(key: str) -> str:
    """An extra key as a header-name suffix: client-go's ``headerKeyEscape``."""
    return "".join(chr(b) if b in _TCHAR else f"%{b:02X}" for b in key.encode("utf-8"))


def _names(values: Sequence[str], flag: str) -> tuple[str, ...]:
    out = tuple(v.strip() for v in values)
    if any(not v for v in out):
        raise ValueError(f"{flag}: empty header name")
    return out


@dataclass(frozen=True)
class RequestHeaderNames:
    """The header names of the convention (kube's ``--requestheader-*`` flags; kubeadm's values)."""

    username: tuple[str, ...] = ("X-Remote-User",)
    group: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefix: tuple[str, ...] = ("X-Remote-Extra-",)
    uid: tuple[str, ...] = ()
    # Derived in ``__post_init__`` (not fields: no part of equality): the exact names lower-cased,
    # and the prefixes (``x-remote-`` first) lower-cased.
    _exact: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        _names(self.username, "--requestheader-username-headers")
        _names(self.group, "--requestheader-group-headers")
        _names(self.extra_prefix, "--requestheader-extra-headers-prefix")
        _names(self.uid, "--requestheader-uid-headers")
        if not self.username:
            raise ValueError("--requestheader-username-headers: at least one header is needed")
        # Lower-cased once: every header of every passed-through request is checked against them.
        object.__setattr__(self, "_exact", frozenset(n.lower() for n in (*self.username, *self.group, *self.uid)))
        prefixes = (_ALWAYS_STRIPPED_PREFIX, *(p.lower() for p in self.extra_prefix))
        object.__setattr__(self, "_prefixes", prefixes)

    @classmethod
    def from_lists(
        cls, username: Sequence[str], group: Sequence[str], extra_prefix: Sequence[str], uid: Sequence[str] = ()
    ) -> RequestHeaderNames:
        return cls(
            _names(username, "--requestheader-username-headers"),
            _names(group, "--requestheader-group-headers"),
            _names(extra_prefix, "--requestheader-extra-headers-prefix"),
            _names(uid, "--requestheader-uid-headers"),
        )

    def merged(self, other: RequestHeaderNames) -> RequestHeaderNames:
        """``other``'s names first (they are the ones sent), then any of ours it lacks (still stripped)."""

        def union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
            seen = {n.lower() for n in a}
            return a + tuple(n for n in b if n.lower() not in seen)

        return RequestHeaderNames(
            union(other.username, self.username),
            union(other.group, self.group),
            union(other.extra_prefix, self.extra_prefix),
            union(other.uid, self.uid),
        )

    def is_identity_header(self, name: str) -> bool:
        """True for a header (lower-case name) that claims an identity under this convention."""
        return name in self._exact or name.startswith(self._prefixes)

    def headers_for(self, user: UserInfo) -> list[tuple[str, str]]:
        """The header lines that present ``user`` (first name of each list, as client-go sends them)."""
        lines = [(self.username[0], user.username)]
        if user.uid and self.uid:
            lines.append((self.uid[0], user.uid))
        if self.group:
            lines += [(self.group[0], g) for g in user.groups]
        if self.extra_prefix:
            prefix = self.extra_prefix[0]
            for key, values in sorted(user.extra.items()):
                lines += [(prefix + escape_extra_key(key), v) for v in values]
        return lines

    def user_from(self, headers: Mapping[str, str]) -> UserInfo | None:
        """The user these headers (lower-case names) present, as kube's request-header authenticator
        reads them; None without a user name.

        ``headers`` joins repeated lines with ``", "`` (the HTTP layer's dict), so a group or extra
        value is split there: values containing ``", "`` cannot be told apart (a simulator's limit).
        """
        username = next((v for v in (headers.get(n.lower(), "") for n in self.username) if v), "")
        if not username:
            return None
        uid = next((v for v in (headers.get(n.lower(), "") for n in self.uid) if v), "")
        groups = [g for n in self.group for g in _split(headers.get(n.lower(), ""))]
        extra: dict[str, tuple[str, ...]] = {}
        for prefix in self.extra_prefix:
            p = prefix.lower()
            for name, value in headers.items():
                if name.startswith(p):
                    key = unquote(name[len(p) :])
                    extra[key] = (*extra.get(key, ()), *_split(value))
        return with_authenticated_group(UserInfo(username, uid, tuple(groups), extra))


def _split(value: str) -> list[str]:
    return [v for v in value.split(", ") if v]


class RequestHeaderAuthenticator:
    """The user a front proxy names in headers, believed only over a client certificate issued by
    the request-header CA with an allowed CN (kube's ``requestheader`` authenticator).

    ``issuers`` are the subjects (as ``getpeercert()`` renders them) of the request-header CA
    certificates. The TLS layer has already verified the chain against every CA the server
    trusts; the issuer tells which one signed it, so the client CA and the request-header CA
    must have different subjects (checked at start).
    """

    def __init__(self, issuers: Sequence[Any], allowed_names: Sequence[str], names: RequestHeaderNames) -> None:
        self.issuers = [distinguished_name(i) for i in issuers]
        self.allowed_names = frozenset(allowed_names)
        self.names = names

    def is_front_proxy(self, peercert: Mapping[str, Any] | None) -> bool:
        """True for a verified certificate from the request-header CA with an allowed CN."""
        if not peercert or distinguished_name(peercert.get("issuer")) not in self.issuers:
            return False
        return not self.allowed_names or common_name(peercert) in self.allowed_names

    def authenticate(self, headers: Mapping[str, str], peercert: Mapping[str, Any] | None) -> UserInfo | None:
        if not self.is_front_proxy(peercert):
            return None
        return self.names.user_from(headers)


def common_name(cert: Mapping[str, Any]) -> str:
    """The subject's CommonName (the last one, as Go's ``pkix.Name``), "" if none."""
    name = ""
    for rdn in cert.get("subject") or ():
        for attr, value in rdn:
            if attr == "commonName":
                name = value
    return name


def ca_subjects(ca_file: str) -> list[Any]:
    """The subjects of the CA certificates in a PEM bundle, as ``getpeercert()`` renders an issuer."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=ca_file)
    return [c["subject"] for c in ctx.get_ca_certs()]

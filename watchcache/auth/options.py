"""Command-line flags of the gate and of the pass-through identity (kube's flag names where kube has one)."""

from __future__ import annotations

import argparse

from watchcache.auth import AuthOptions
from watchcache.auth.requestheader import RequestHeaderNames
from watchcache.upstream.identity import MODES, IdentityOptions

_DEFAULTS = AuthOptions()


def add_auth_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--authentication`` and the gate's tunables."""
    parser.add_argument(
        "--authentication",
        choices=["delegated", "none"],
        default=None,
        help="delegated: authenticate (TokenReview) and authorize (SubjectAccessReview) every cached read with "
        "the upstream; none: serve cached reads to anyone who reaches the port (logged loudly). Default: "
        "delegated for a TLS upstream (a real cluster), none for a plain-http one (the simulated cluster)",
    )
    parser.add_argument(
        "--anonymous-auth",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULTS.anonymous,
        help="requests without credentials are system:anonymous (then authorized like any user) rather than "
        "401 (default %(default)s, as kube-apiserver)",
    )
    parser.add_argument(
        "--authentication-token-webhook-cache-ttl",
        type=float,
        default=_DEFAULTS.token_allow_ttl,
        metavar="SECONDS",
        help="how long an authenticated token is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authentication-token-webhook-cache-unauthorized-ttl",
        type=float,
        default=_DEFAULTS.token_deny_ttl,
        metavar="SECONDS",
        help="how long a rejected token is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authorization-webhook-cache-authorized-ttl",
        type=float,
        default=_DEFAULTS.access_allow_ttl,
        metavar="SECONDS",
        help="how long an allow is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authorization-webhook-cache-unauthorized-ttl",
        type=float,
        default=_DEFAULTS.access_deny_ttl,
        metavar="SECONDS",
        help="how long a deny is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authorization-always-allow-groups",
        default=",".join(_DEFAULTS.always_allow_groups),
        metavar="GROUP,...",
        help="groups allowed everything without a SubjectAccessReview (default %(default)s; '' for none)",
    )


def auth_mode(args: argparse.Namespace, upstream_is_tls: bool) -> str:
    """``delegated`` or ``none``: the flag, else delegated in front of a real (TLS) cluster."""
    return args.authentication or ("delegated" if upstream_is_tls else "none")


def auth_options(args: argparse.Namespace, upstream_is_tls: bool = True) -> AuthOptions | None:
    """The gate's options from parsed flags; None when authentication is ``none``."""
    if auth_mode(args, upstream_is_tls) == "none":
        return None
    for flag in (
        "authentication_token_webhook_cache_ttl",
        "authentication_token_webhook_cache_unauthorized_ttl",
        "authorization_webhook_cache_authorized_ttl",
        "authorization_webhook_cache_unauthorized_ttl",
    ):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must not be negative")
    return AuthOptions(
        anonymous=args.anonymous_auth,
        token_allow_ttl=args.authentication_token_webhook_cache_ttl,
        token_deny_ttl=args.authentication_token_webhook_cache_unauthorized_ttl,
        access_allow_ttl=args.authorization_webhook_cache_authorized_ttl,
        access_deny_ttl=args.authorization_webhook_cache_unauthorized_ttl,
        always_allow_groups=tuple(g.strip() for g in args.authorization_always_allow_groups.split(",") if g.strip()),
    )


_NAMES = RequestHeaderNames()


def add_identity_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How pass-through requests of client-certificate users reach the upstream."""
    parser.add_argument(
        "--client-cert-passthrough",
        choices=MODES,
        default=None,
        help="how writes, discovery and other pass-through requests of a user who authenticated with a client "
        "certificate (--client-ca-file) reach the upstream: front-proxy presents --proxy-client-cert-file and "
        "names the user in X-Remote-User/-Group/-Extra-* headers (the upstream must trust it: "
        "--requestheader-client-ca-file, --requestheader-allowed-names); impersonate sends them with the "
        "proxy's own identity and Impersonate-User/-Group (it needs the impersonate verb on users and groups); "
        "refuse answers 403 (never anonymous). Default: front-proxy with --proxy-client-cert-file, else refuse. "
        "Bearer tokens always pass through as given",
    )
    parser.add_argument(
        "--proxy-client-cert-file",
        metavar="FILE",
        help="front-proxy client certificate (PEM) presented to the upstream on pass-through requests of "
        "client-certificate users, as kube-apiserver's flag of that name (reloaded when it changes)",
    )
    parser.add_argument("--proxy-client-key-file", metavar="FILE", help="the key of --proxy-client-cert-file")
    parser.add_argument(
        "--requestheader-username-headers",
        default=",".join(_NAMES.username),
        metavar="HEADER,...",
        help="user headers of the front-proxy convention: the first is sent, all are stripped from clients "
        "(default %(default)s; the upstream's published names, from kube-system/extension-apiserver-authentication, "
        "are added when readable)",
    )
    parser.add_argument(
        "--requestheader-group-headers",
        default=",".join(_NAMES.group),
        metavar="HEADER,...",
        help="group headers, likewise (default %(default)s)",
    )
    parser.add_argument(
        "--requestheader-extra-headers-prefix",
        default=",".join(_NAMES.extra_prefix),
        metavar="PREFIX,...",
        help="extra header prefixes, likewise (default %(default)s). Whatever the flags, X-Remote-* headers from "
        "clients are never forwarded",
    )


def identity_options(args: argparse.Namespace) -> IdentityOptions:
    """The pass-through identity from parsed flags."""

    def split(text: str) -> list[str]:
        return [v for v in text.split(",") if v.strip()]

    mode = args.client_cert_passthrough or ("front-proxy" if args.proxy_client_cert_file else "refuse")
    return IdentityOptions(
        mode=mode,
        proxy_client_cert_file=args.proxy_client_cert_file,
        proxy_client_key_file=args.proxy_client_key_file,
        names=RequestHeaderNames.from_lists(
            split(args.requestheader_username_headers),
            split(args.requestheader_group_headers),
            split(args.requestheader_extra_headers_prefix),
        ),
    )

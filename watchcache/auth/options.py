"""Command-line flags of the gate (kube's flag names where kube has one)."""

from __future__ import annotations

import argparse

from watchcache.argtypes import Number
from watchcache.auth.gate import AuthOptions

_DEFAULTS = AuthOptions()
# Cache lifetimes: 0 caches nothing (every request asks the upstream again).
_SECONDS = Number()


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
        type=_SECONDS,
        default=_DEFAULTS.token_allow_ttl,
        metavar="SECONDS",
        help="how long an authenticated token is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authentication-token-webhook-cache-unauthorized-ttl",
        type=_SECONDS,
        default=_DEFAULTS.token_deny_ttl,
        metavar="SECONDS",
        help="how long a rejected token is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authorization-webhook-cache-authorized-ttl",
        type=_SECONDS,
        default=_DEFAULTS.access_allow_ttl,
        metavar="SECONDS",
        help="how long an allow is cached (default %(default)s)",
    )
    parser.add_argument(
        "--authorization-webhook-cache-unauthorized-ttl",
        type=_SECONDS,
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
    return AuthOptions(
        anonymous=args.anonymous_auth,
        token_allow_ttl=args.authentication_token_webhook_cache_ttl,
        token_deny_ttl=args.authentication_token_webhook_cache_unauthorized_ttl,
        access_allow_ttl=args.authorization_webhook_cache_authorized_ttl,
        access_deny_ttl=args.authorization_webhook_cache_unauthorized_ttl,
        always_allow_groups=tuple(g.strip() for g in args.authorization_always_allow_groups.split(",") if g.strip()),
    )

"""Command-line flags of the pass-through identity (kube-apiserver's flag names where it has one)."""

from __future__ import annotations

import argparse
import ssl

from watchcache.auth.requestheader import RequestHeaderNames
from watchcache.upstream.config import ClientCertificate
from watchcache.upstream.identity import MODES, IdentityOptions

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


def check_identity_files(options: IdentityOptions) -> None:
    """Load the front-proxy certificate once, before anything starts: a pair that cannot be loaded stops the
    start naming its flags (before, every worker failed with a bare ``[Errno 2]``)."""
    cert, key = options.proxy_client_cert_file, options.proxy_client_key_file
    if cert and key:
        try:
            ClientCertificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key)
        except (OSError, ssl.SSLError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"--proxy-client-cert-file {cert}, --proxy-client-key-file {key}: {why}") from None

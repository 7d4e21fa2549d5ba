"""How to reach the upstream kube-apiserver: kubeconfig, in-cluster service account, or flags.

Flag names follow kubectl's (``--kubeconfig``, ``--context``, ``--token-file``,
``--client-certificate``, ``--client-key``, ``--certificate-authority``). TLS is verified
unless ``insecure-skip-tls-verify`` is set explicitly. Tokens are never logged.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("watchcache.upstream.config")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class UpstreamConfigError(ValueError):
    pass


@dataclass(frozen=True)
class UpstreamConfig:
    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    insecure: bool = False
    client_cert: str | None = None
    client_key: str | None = None
    token: str | None = None
    token_file: str | None = None
    tls_server_name: str | None = None

    @property
    def is_tls(self) -> bool:
        return self.server.startswith("https://")

    def ssl_context(self, *, with_client_cert: bool = True) -> ssl.SSLContext | None:
        """The TLS context for upstream connections (None for plain http).

        ``with_client_cert=False`` is for pass-through traffic: requests forwarded with a
        client's own credentials must not also present the proxy's certificate, or the
        upstream would authenticate them as the proxy.
        """
        if not self.is_tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if with_client_cert and self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    def describe(self) -> str:
        """For logs: where and how, never the secret."""
        if self.token_file:
            auth = "token-file"
        elif self.token:
            auth = "token"
        else:
            auth = "client-cert" if self.client_cert else "none"
        return f"{self.server} (auth: {auth}, tls-verify: {not self.insecure and self.is_tls})"


class TokenSource:
    """The bearer token, re-read from its file at most once a minute (service-account tokens rotate)."""

    def __init__(self, config: UpstreamConfig, clock: Any = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._token = config.token
        self._read_at = -1e9

    def token(self) -> str | None:
        path = self._config.token_file
        if path and self._clock() - self._read_at > 60.0:
            self._token = Path(path).read_text().strip()
            self._read_at = self._clock()
        return self._token

    def headers(self) -> dict[str, str]:
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}


def _materialise(data_b64: str, suffix: str) -> str:
    """kubeconfig ``*-data`` fields are base64 PEM; ssl wants files for client certs."""
    fd, path = tempfile.mkstemp(prefix="watchcache-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data_b64))
    os.chmod(path, 0o600)
    return path


def _resolve(base: Path, value: str | None) -> str | None:
    if not value:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def _named(entries: list[dict[str, Any]] | None, name: str, what: str) -> dict[str, Any]:
    for entry in entries or []:
        if entry.get("name") == name:
            return entry.get(what) or {}
    raise UpstreamConfigError(f"kubeconfig has no {what} named {name!r}")


def from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> UpstreamConfig:
    file = Path(path).expanduser()
    try:
        doc = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UpstreamConfigError(f"cannot read kubeconfig {file}: {e}") from None
    name = context or doc.get("current-context")
    if not name:
        raise UpstreamConfigError(f"kubeconfig {file} has no current-context; pass --context")
    ctx = _named(doc.get("contexts"), name, "context")
    cluster = _named(doc.get("clusters"), ctx.get("cluster", ""), "cluster")
    user = _named(doc.get("users"), ctx.get("user", ""), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise UpstreamConfigError(
            "kubeconfig exec/auth-provider credentials are not supported; use a token or client certificate"
        )
    base = file.parent
    server = cluster.get("server")
    if not server:
        raise UpstreamConfigError(f"cluster of context {name!r} has no server")
    cert = _resolve(base, user.get("client-certificate"))
    key = _resolve(base, user.get("client-key"))
    if user.get("client-certificate-data"):
        cert = _materialise(user["client-certificate-data"], ".crt")
    if user.get("client-key-data"):
        key = _materialise(user["client-key-data"], ".key")
    ca_b64 = cluster.get("certificate-authority-data")
    ca_data = base64.b64decode(ca_b64).decode() if ca_b64 else None
    return UpstreamConfig(
        server=server.rstrip("/"),
        ca_file=_resolve(base, cluster.get("certificate-authority")),
        ca_data=ca_data,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert=cert,
        client_key=key,
        token=user.get("token"),
        token_file=_resolve(base, user.get("tokenFile")),
        tls_server_name=cluster.get("tls-server-name"),
    )


def in_cluster() -> UpstreamConfig:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise UpstreamConfigError("not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
    host = f"[{host}]" if ":" in host else host
    return UpstreamConfig(
        server=f"https://{host}:{port}",
        ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        token_file=str(SERVICE_ACCOUNT_DIR / "token"),
    )


def from_flags(
    upstream: str,
    *,
    token_file: str | None = None,
    client_certificate: str | None = None,
    client_key: str | None = None,
    certificate_authority: str | None = None,
    insecure_skip_tls_verify: bool = False,
) -> UpstreamConfig:
    if not upstream.startswith(("http://", "https://")):
        raise UpstreamConfigError(f"--upstream must be an http(s) URL, got {upstream!r}")
    if bool(client_certificate) != bool(client_key):
        raise UpstreamConfigError("--client-certificate and --client-key go together")
    return UpstreamConfig(
        server=upstream.rstrip("/"),
        ca_file=certificate_authority,
        insecure=insecure_skip_tls_verify,
        client_cert=client_certificate,
        client_key=client_key,
        token_file=token_file,
    )


def upstream_from_args(args: Any) -> UpstreamConfig | None:
    """The apiserver ``watchcache serve``'s flags name; None: the embedded simulated cluster."""
    if args.kubeconfig:
        return from_kubeconfig(args.kubeconfig, args.context)
    if args.in_cluster:
        return in_cluster()
    if args.upstream:
        return from_flags(
            args.upstream,
            token_file=args.token_file,
            client_certificate=args.client_certificate,
            client_key=args.client_key,
            certificate_authority=args.certificate_authority,
            insecure_skip_tls_verify=args.insecure_skip_tls_verify,
        )
    return None


class ClientCertificate:
    """A client certificate in an ``SSLContext``, loaded again when its files change (rotation).

    The front-proxy certificate of pass-through (``--proxy-client-cert-file``, ``upstream/identity.py``).
    """

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self._stamp = self._mtimes()
        context.load_cert_chain(cert_file, key_file)

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def reload_if_changed(self) -> bool:
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            log.warning("keeping the previous front-proxy client certificate: %s", e)
            return False
        self._stamp = stamp
        log.info("front-proxy client certificate reloaded from %s", self.cert_file)
        return True

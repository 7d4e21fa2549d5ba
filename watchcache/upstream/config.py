"""How to reach the upstream kube-apiserver: kubeconfig, in-cluster service account, or flags.

Flag names follow kubectl's (``--kubeconfig``, ``--context``, ``--token-file``,
``--client-certificate``, ``--client-key``, ``--certificate-authority``). TLS is verified
unless ``insecure-skip-tls-verify`` is set explicitly. Tokens are never logged. Certificate
material from a kubeconfig's ``*-data`` fields (or an exec plugin) stays in memory: ``ssl`` loads
it through an anonymous in-memory file, never one on disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("watchcache.upstream.config")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class UpstreamConfigError(ValueError):
    pass


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path ``ssl`` can open that holds ``data`` and lives only as long as the block: an anonymous
    memory file (Linux ``memfd``), else a private temporary file deleted at once."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = memfd("watchcache-pem", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="watchcache-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        os.unlink(path)


def load_cert_chain_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``SSLContext.load_cert_chain`` from PEM bytes (the stdlib takes only paths)."""
    with _memory_file(cert) as cert_path, _memory_file(key) as key_path:
        ctx.load_cert_chain(cert_path, key_path)


EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")


@dataclass(frozen=True)
class ExecConfig:
    """A kubeconfig user's ``exec`` section, validated (``upstream.kubeconfig``)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    interactive_mode: str = "Never"
    install_hint: str = ""
    # spec.cluster, when the kubeconfig says provideClusterInfo.
    cluster: dict[str, Any] | None = None


@dataclass(frozen=True)
class UpstreamConfig:
    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    insecure: bool = False
    client_cert: str | None = None
    client_key: str | None = None
    # PEM bytes of a kubeconfig's client-certificate(-data)/client-key(-data), held in memory.
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    username: str | None = None
    password: str | None = None
    tls_server_name: str | None = None
    # http://, https:// or socks5:// (kubeconfig proxy-url); None: HTTPS_PROXY/NO_PROXY as client-go.
    proxy_url: str | None = None
    exec: ExecConfig | None = None
    disable_compression: bool = False
    # Where it came from, for the log line at start.
    source: str = "flags"

    @property
    def is_tls(self) -> bool:
        return self.server.startswith("https://")

    @property
    def has_client_cert(self) -> bool:
        return bool(self.client_cert or self.client_cert_data)

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
        if with_client_cert:
            if self.client_cert:
                ctx.load_cert_chain(self.client_cert, self.client_key)
            elif self.client_cert_data and self.client_key_data:
                load_cert_chain_data(ctx, self.client_cert_data, self.client_key_data)
        return ctx

    def check(self) -> None:
        """Read the TLS files now, once, before anything starts: one that cannot be read stops the start with
        its name (before, every worker failed with a bare ``[Errno 2]``)."""
        if not self.is_tls:
            return
        for field_name, path in (
            ("certificate-authority", self.ca_file),
            ("client-certificate", self.client_cert),
            ("client-key", self.client_key),
        ):
            if path:
                try:
                    Path(path).read_bytes()
                except OSError as e:
                    raise UpstreamConfigError(f"the upstream's {field_name} {path}: {e.strerror or e}") from None
        try:
            self.ssl_context()
        except (OSError, ssl.SSLError) as e:
            files = ", ".join(p for p in (self.ca_file, self.client_cert, self.client_key) if p) or "kubeconfig data"
            raise UpstreamConfigError(f"the upstream's TLS files ({files}) cannot be loaded: {e}") from None

    def describe(self) -> str:
        """For logs: where and how, never the secret."""
        if self.exec is not None:
            auth = f"exec plugin {self.exec.command}"
        elif self.token_file:
            auth = "token-file"
        elif self.token:
            auth = "token"
        elif self.username:
            auth = "basic"
        else:
            auth = "client-cert" if self.has_client_cert else "none"
        proxy = f", proxy: {_redacted(self.proxy_url)}" if self.proxy_url else ""
        return f"{self.server} (auth: {auth}, tls-verify: {not self.insecure and self.is_tls}{proxy}; {self.source})"


def _redacted(url: str) -> str:
    """A proxy URL without its password."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def _service_server(env: Mapping[str, str]) -> str | None:
    """The apiserver a pod reaches through its service env (``KUBERNETES_SERVICE_HOST``/``_PORT``); None elsewhere."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def in_cluster_possible(env: Mapping[str, str] | None = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    """client-go's inClusterClientConfig.Possible: the service env and the service account's token are there."""
    env = os.environ if env is None else env
    return _service_server(env) is not None and (service_account_dir / "token").exists()


def in_cluster(env: Mapping[str, str] | None = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> UpstreamConfig:
    """The pod's service account and ``KUBERNETES_SERVICE_HOST``/``_PORT`` (client-go's InClusterConfig)."""
    env = os.environ if env is None else env
    server = _service_server(env)
    if server is None:
        raise UpstreamConfigError("not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
    return UpstreamConfig(
        server=server,
        ca_file=str(service_account_dir / "ca.crt"),
        token_file=str(service_account_dir / "token"),
        source="in-cluster service account",
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
        # The failed reload last warned about: (the files' mtimes, the error).
        self._failure: tuple[tuple[float, float] | None, str] | None = None

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def reload_if_changed(self) -> bool:
        """Load the pair again if a file changed; one that cannot be loaded keeps the previous one, warned
        about once per distinct failure (not at every tick)."""
        stamp = None
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                self._failure = None
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            if (stamp, str(e)) != self._failure:
                self._failure = (stamp, str(e))
                log.warning("keeping the previous front-proxy client certificate: %s", e)
            return False
        self._failure = None
        self._stamp = stamp
        log.info("front-proxy client certificate reloaded from %s", self.cert_file)
        return True

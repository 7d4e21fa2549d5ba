"""TLS serving: the serving certificate (reloaded when its files change) and optional client certificates.

ALPN offers ``http/1.1``, and ``h2`` first with ``--http2`` (watchcache.http.h2protocol), as
kube-apiserver does: clients that speak HTTP/2 (client-go, kubectl) then multiplex their watches
on one connection. Connection upgrades (exec, attach, port-forward) stay on HTTP/1.1: client-go
dials those with ALPN ``http/1.1`` only.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger("watchcache.http.tls")


@dataclass(frozen=True)
class TlsOptions:
    """The serving certificate's files, and the CA of client certificates to accept (if any)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def __post_init__(self) -> None:
        if not self.cert_file or not self.key_file:
            raise ValueError("--tls-cert-file and --tls-private-key-file go together")

    @classmethod
    def from_files(cls, cert_file: str | None, key_file: str | None, client_ca_file: str | None) -> TlsOptions | None:
        """From the flags; None serves plain HTTP."""
        if not cert_file and not key_file:
            if client_ca_file:
                raise ValueError("--client-ca-file needs --tls-cert-file")
            return None
        return cls(cert_file or "", key_file or "", client_ca_file)

    def check(self) -> None:
        """Load every file once, as the server will: one that cannot be read stops the start (ValueError)."""
        ServingCert(self.cert_file, self.key_file, self.client_ca_file)


class ServingCert:
    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca_file: str | None = None,
        requestheader_ca_file: str | None = None,
        *,
        http2: bool = False,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
        if client_ca_file:
            # Optional, as kube-apiserver: a client may present a certificate or a bearer token.
            _load_ca(ctx, client_ca_file, "--client-ca-file")
            ctx.verify_mode = ssl.CERT_OPTIONAL
        if requestheader_ca_file:
            # A front proxy's certificate (the simulated cluster as an apiserver); authenticators
            # tell the two CAs apart by issuer.
            _load_ca(ctx, requestheader_ca_file, "--requestheader-client-ca-file")
            ctx.verify_mode = ssl.CERT_OPTIONAL
        self.context = ctx
        self._stamp: tuple[float, float] = (0.0, 0.0)
        # The failed reload last warned about (the files' mtimes, what failed): said once, not every tick.
        self._failure: tuple[tuple[float, float] | None, str] | None = None
        try:
            stamp = self._mtimes()
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"--tls-cert-file {cert_file}, --tls-private-key-file {key_file}: {_why(e)}") from None
        self._stamp = stamp

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def reload_if_changed(self) -> bool:
        """Load the pair again if either file changed; new connections use it (rotation without restart).

        A pair that cannot be loaded (a file missing mid-rotation, a key that does not match) keeps the
        previous certificate serving; the warning is logged once per distinct failure, and its end is
        logged too."""
        stamp = None
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                self._recovered()
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            failure = (stamp, _why(e))
            if failure != self._failure:
                self._failure = failure
                log.warning("keeping the previous serving certificate: cannot load %s: %s", self.cert_file, failure[1])
            return False
        self._failure = None
        log.info("serving certificate reloaded from %s", self.cert_file)
        self._stamp = stamp
        return True

    def _recovered(self) -> None:
        if self._failure is not None:
            self._failure = None
            log.info("serving certificate files readable again (unchanged): %s", self.cert_file)


def _load_ca(ctx: ssl.SSLContext, path: str, flag: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"{flag} {path}: {_why(e)}") from None


def _why(e: OSError | ssl.SSLError) -> str:
    """What went wrong, without Python's noise: "No such file or directory: '/x.pem'", "KEY_VALUES_MISMATCH"."""
    if isinstance(e, ssl.SSLError):
        return f"not a matching PEM certificate and key ({e.reason or e})"
    if e.strerror:
        return f"{e.strerror}: {e.filename!r}" if e.filename else e.strerror
    return str(e)

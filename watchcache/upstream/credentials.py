"""watchcache's own credential toward the upstream: a token, a token file, basic auth, or an exec plugin.

Exec plugins behave as client-go's (``k8s.io/client-go/plugin/pkg/client/auth/exec``):

- the plugin gets ``KUBERNETES_EXEC_INFO`` (an ``ExecCredential`` with ``spec.interactive`` and, with
  ``provideClusterInfo``, ``spec.cluster``), the process environment plus the kubeconfig's ``env``;
- its answer (``client.authentication.k8s.io/v1`` or ``v1beta1``) is cached until its
  ``expirationTimestamp`` (forever without one), then the plugin runs again before the next request;
- a 401 to a request sent with the cached credential runs it again (once: the requests that failed
  with it are not retried here, their callers retry as they do for any failure);
- one run at a time: every request waiting for a credential shares it;
- ``interactiveMode``: the plugin's stdin is the terminal only when the mode allows it and stdin is a
  terminal; ``Always`` without one is an error at start (a proxy usually has none).

A plugin may answer a client certificate instead of (or as well as) a token; ``on_certificate`` hands
it to the upstream client, which loads it from memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from watchcache.upstream.config import ExecConfig, UpstreamConfig

log = logging.getLogger("watchcache.upstream.credentials")

# A plugin that has not answered by then is killed (client-go waits forever; a proxy must not).
EXEC_TIMEOUT = 120.0
# A token file is read again at most this often (client-go's cachingTokenSource re-reads each minute).
TOKEN_FILE_PERIOD = 60.0


class CredentialError(OSError):
    """The exec plugin failed, or answered something that is not a usable ExecCredential.

    An OSError, so that every caller of the upstream treats it as it treats an unreachable upstream:
    retry with backoff, loudly (the plugin runs again on the next request)."""


def interactive(plugin: ExecConfig) -> bool:
    """client-go: never with Never; with a terminal on stdin otherwise (Always without one: an error)."""
    if plugin.interactive_mode == "Never":
        return False
    tty = sys.stdin is not None and sys.stdin.isatty()
    if plugin.interactive_mode == "Always" and not tty:
        raise CredentialError(
            f"exec plugin {plugin.command!r} has interactiveMode Always, but standard input is not a terminal "
            "(watchcache runs as a service): set interactiveMode to Never or IfAvailable, or use another credential"
        )
    return tty


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    client_cert: bytes | None
    client_key: bytes | None
    # Seconds since the epoch (None: never expires).
    expires: float | None

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


def _parse_time(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise CredentialError(f"expirationTimestamp {text!r} is not an RFC 3339 time") from None


def parse_exec_output(plugin: ExecConfig, stdout: bytes) -> ExecCredential:
    """The plugin's ExecCredential, checked as client-go checks it."""
    try:
        doc = orjson.loads(stdout)
    except orjson.JSONDecodeError as e:
        raise CredentialError(f"exec plugin {plugin.command!r}: output is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise CredentialError(f"exec plugin {plugin.command!r}: output is not an ExecCredential")
    if doc.get("apiVersion") != plugin.api_version:
        raise CredentialError(
            f"exec plugin {plugin.command!r} is configured to use API version {plugin.api_version}, plugin "
            f"returned version {doc.get('apiVersion')}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        raise CredentialError(f"exec plugin {plugin.command!r} didn't return a status field")
    token = status.get("token") or None
    cert = status.get("clientCertificateData") or None
    key = status.get("clientKeyData") or None
    if not token and not cert and not key:
        raise CredentialError(f"exec plugin {plugin.command!r} didn't return a token or cert/key pair")
    if bool(cert) != bool(key):
        raise CredentialError(
            f"exec plugin {plugin.command!r}: clientCertificateData and clientKeyData must both be present"
        )
    expires = status.get("expirationTimestamp")
    return ExecCredential(
        token=str(token) if token else None,
        client_cert=str(cert).encode() if cert else None,
        client_key=str(key).encode() if key else None,
        expires=_parse_time(str(expires)) if expires else None,
    )


async def run_exec(plugin: ExecConfig) -> ExecCredential:
    """Run the plugin once, as client-go does; CredentialError with its stderr if it fails."""
    is_interactive = interactive(plugin)
    spec: dict[str, Any] = {"interactive": is_interactive}
    if plugin.cluster is not None:
        spec["cluster"] = plugin.cluster
    info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": orjson.dumps(info).decode()}
    try:
        proc = await asyncio.create_subprocess_exec(
            plugin.command,
            *plugin.args,
            env=env,
            stdin=None if is_interactive else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=None if is_interactive else asyncio.subprocess.PIPE,
        )
    except OSError as e:
        hint = f"\n{plugin.install_hint}" if plugin.install_hint else ""
        raise CredentialError(f"exec plugin {plugin.command!r}: {e.strerror or e}{hint}") from None
    try:
        async with asyncio.timeout(EXEC_TIMEOUT):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CredentialError(f"exec plugin {plugin.command!r} did not answer in {EXEC_TIMEOUT:.0f}s") from None
    text = (stderr or b"").decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        raise CredentialError(
            f"exec plugin {plugin.command!r} exited with {proc.returncode}" + (f": {text[-2000:]}" if text else "")
        )
    if text:
        log.info("exec plugin %r said: %s", plugin.command, text[-2000:])
    return parse_exec_output(plugin, stdout)


class Credentials:
    """The headers of watchcache's own requests; the exec plugin's certificate via ``on_certificate``.

    ``headers()`` is the current credential (pass-through's impersonation route asks synchronously);
    ``fresh_headers()`` first runs the plugin when it has no credential or the one it has expired;
    ``rejected(headers)`` is told of a 401 to a request sent with ``headers``.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall = wall
        self._token = config.token
        self._read_at = -1e18
        basic = None
        if config.username is not None and config.password is not None:
            basic = base64.b64encode(f"{config.username}:{config.password}".encode()).decode()
        self._basic = basic
        self.plugin = config.exec
        self.credential: ExecCredential | None = None
        self._stale = False
        self._running: asyncio.Future[ExecCredential] | None = None
        self.on_certificate: Callable[[bytes, bytes], None] | None = None
        # Plugin runs and failures (metrics, tests).
        self.runs = 0
        self.failures = 0
        self.last_error: str | None = None

    def _file_token(self) -> str | None:
        path = self.config.token_file
        if path and self._clock() - self._read_at > TOKEN_FILE_PERIOD:
            self._token = Path(path).read_text().strip()
            self._read_at = self._clock()
        return self._token

    def token(self) -> str | None:
        if self.credential is not None and self.credential.token:
            return self.credential.token
        return self._file_token()

    def headers(self) -> dict[str, str]:
        if self._needs_run():
            # Asked synchronously (pass-through's impersonation route): the request goes with what
            # there is, and the plugin runs for the next one.
            with contextlib.suppress(RuntimeError):  # no running loop
                asyncio.get_running_loop()
                self._start()
        token = self.token()
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self._basic:
            return {"Authorization": f"Basic {self._basic}"}
        return {}

    def _needs_run(self) -> bool:
        if self.plugin is None:
            return False
        c = self.credential
        return c is None or self._stale or c.expired(self._wall())

    async def fresh_headers(self) -> dict[str, str]:
        """The headers for a request now: the plugin runs first if its credential is missing or expired."""
        if self._needs_run():
            await self.refresh()
        return self.headers()

    async def refresh(self) -> ExecCredential:
        """Run the plugin (one run at a time; concurrent callers share it)."""
        return await asyncio.shield(self._start())

    def _start(self) -> asyncio.Future[ExecCredential]:
        if self._running is None:
            assert self.plugin is not None
            running = asyncio.ensure_future(self._run(self.plugin))
            running.add_done_callback(self._ran)
            self._running = running
        return self._running

    def _ran(self, running: asyncio.Future[ExecCredential]) -> None:
        if self._running is running:
            self._running = None
        if not running.cancelled():
            running.exception()  # logged by _run; retrieved so asyncio does not report it again

    async def _run(self, plugin: ExecConfig) -> ExecCredential:
        self.runs += 1
        try:
            credential = await run_exec(plugin)
        except CredentialError as e:
            self.failures += 1
            self.last_error = str(e)
            log.error("%s", e)
            raise
        self.last_error = None
        self.credential = credential
        self._stale = False
        expiry = (
            datetime.datetime.fromtimestamp(credential.expires, datetime.UTC).isoformat(timespec="seconds")
            if credential.expires is not None
            else "never"
        )
        kinds = [k for k, v in (("token", credential.token), ("client certificate", credential.client_cert)) if v]
        log.info("exec plugin %r gave a %s (expires %s)", plugin.command, " and a ".join(kinds), expiry)
        if credential.client_cert and credential.client_key and self.on_certificate is not None:
            self.on_certificate(credential.client_cert, credential.client_key)
        return credential

    def rejected(self, headers: dict[str, str]) -> None:
        """A 401 to a request sent with ``headers``: with an exec plugin, run it again before the next
        request, unless a newer credential than the one that failed is already there (client-go's rule)."""
        if self.plugin is None or self.credential is None:
            return
        if headers.get("Authorization") == self.headers().get("Authorization"):
            if not self._stale:
                log.warning("the upstream answered 401 to the exec plugin's credential: running the plugin again")
            self._stale = True

    def describe(self) -> str:
        if self.plugin is not None:
            return f"exec plugin {self.plugin.command}"
        if self.config.token_file:
            return "token-file"
        if self.config.token:
            return "token"
        if self._basic:
            return "basic"
        return "client-cert" if self.config.has_client_cert else "none"

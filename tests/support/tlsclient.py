"""One HTTPS request to a watchcache process, with a CA, a client certificate or a token, and repeated header lines."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Protocol

from harness.pki import Pair


class Server(Protocol):
    """What a request needs of a server: its URL (a started process, or the reference kube-apiserver's)."""

    url: str


SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


SSR = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def wait_ready_tls(proc: Server, ca: Pair) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if call(proc, ca, "GET", "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("not ready:\n" + "".join(proc.log[-30:]))


def call(
    proc: Server,
    ca: Pair,
    method: str,
    path: str,
    body: dict | None = None,
    *,
    cert: Pair | None = None,
    token: str | None = None,
    headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> tuple[int, dict]:
    """One HTTPS request; repeated header names are sent as repeated lines."""
    ctx = ssl.create_default_context(cafile=str(ca.crt))
    if cert is not None:
        ctx.load_cert_chain(str(cert.crt), str(cert.key))
    port = int(proc.url.rsplit(":", 1)[1])
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.putrequest(method, path)
        lines = [("Accept", "application/json"), *headers]
        if token:
            lines.append(("Authorization", f"Bearer {token}"))
        data = json.dumps(body).encode() if body is not None else b""
        if body is not None:
            lines += [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        for name, value in lines:
            conn.putheader(name, value)
        conn.endheaders(data or None)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw.startswith(b"{") else {"text": raw.decode()}
    finally:
        conn.close()

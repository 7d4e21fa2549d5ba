"""HTTPS serving with client certificates and certificate rotation; request limits answer 429."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import start
from tests.e2e.httpkube import WatchStream, get, path_with


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN=alice, O=team-a)."""
    names = ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt", "cli.key", "cli.csr", "cli.crt", "ext")
    p = {n: d / n for n in names}
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(p["ca.key"]), "-out", str(p["ca.crt"]),
            "-days", "1", "-subj", "/CN=test-ca")  # fmt: skip
    p["ext"].write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subj, ext in (("srv", "/CN=127.0.0.1", ["-extfile", str(p["ext"])]), ("cli", "/CN=alice/O=team-a", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(p[f"{who}.key"]), "-out", str(p[f"{who}.csr"]),
                "-subj", subj)  # fmt: skip
        openssl("x509", "-req", "-in", str(p[f"{who}.csr"]), "-CA", str(p["ca.crt"]), "-CAkey", str(p["ca.key"]),
                "-CAcreateserial", "-out", str(p[f"{who}.crt"]), "-days", "1", *ext)  # fmt: skip
    return p


def https_get(port: int, path: str, ctx: ssl.SSLContext) -> tuple[int, dict, str]:
    """(status, body, the server certificate in PEM)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.request("GET", path)
    cert = ssl.DER_cert_to_PEM_cert(conn.sock.getpeercert(True))
    resp = conn.getresponse()
    raw = resp.read()
    body = json.loads(raw) if resp.getheader("Content-Type", "").startswith("application/json") else {"text": raw}
    conn.close()
    return resp.status, body, cert


def test_https_with_client_certificates_and_rotation(tmp_path):
    pki = make_pki(tmp_path)
    proc = start(
        "serve", "--sim-objects", "5",
        "--tls-cert-file", str(pki["srv.crt"]), "--tls-private-key-file", str(pki["srv.key"]),
        "--client-ca-file", str(pki["ca.crt"]),
    )  # fmt: skip
    try:
        port = int(proc.url.rsplit(":", 1)[1])
        assert proc.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(pki["ca.crt"]))
        ctx.load_cert_chain(str(pki["cli.crt"]), str(pki["cli.key"]))
        status, body, _ = https_get(port, "/api/v1/pods", ctx)
        assert status == 200 and body["kind"] == "PodList"
        # Plain HTTP on the TLS port is not served.
        try:
            res = get(f"http://127.0.0.1:{port}", "/api/v1/pods")
            assert res.status >= 400
        except (ConnectionError, http.client.HTTPException, OSError):
            pass
        # Rotation: a new server certificate is picked up without a restart.
        old_cert = https_get(port, "/readyz", ctx)[2]
        for name in ("srv.csr", "srv.crt"):
            (tmp_path / name).unlink()
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "new.key"), "-out",
                str(tmp_path / "srv.csr"), "-subj", "/CN=127.0.0.1")  # fmt: skip
        openssl("x509", "-req", "-in", str(tmp_path / "srv.csr"), "-CA", str(pki["ca.crt"]), "-CAkey",
                str(pki["ca.key"]), "-CAcreateserial", "-out", str(tmp_path / "new.crt"), "-days", "1",
                "-extfile", str(pki["ext"]))  # fmt: skip
        os.replace(tmp_path / "new.key", pki["srv.key"])
        os.replace(tmp_path / "new.crt", pki["srv.crt"])
        deadline = time.monotonic() + 10
        while True:
            if https_get(port, "/readyz", ctx)[2] != old_cert:
                break
            assert time.monotonic() < deadline, "certificate not reloaded"
            time.sleep(0.3)
    finally:
        proc.stop()


def test_limits_answer_429_with_retry_after():
    proc = start("serve", "--sim-objects", "5", "--max-watchers", "2")
    try:
        url = proc.url
        watches = [WatchStream(url, path_with("/api/v1/pods", watch=1, resourceVersion="0")) for _ in range(2)]
        for w in watches:
            assert w.status == 200
            w.next(5.0)  # registered: its first event came
        third = get(url, "/api/v1/pods", watch=1, resourceVersion="0")
        assert third.status == 429 and third.headers["Retry-After"] == "1"
        assert third.json()["reason"] == "TooManyRequests"
        assert get(url, "/api/v1/pods").status == 200  # other requests go on
        for w in watches:
            w.close()
        metrics = get(url, "/metrics").body.decode()
        assert 'watchcache_rejected_requests_total{limit="watchers"} 1.0' in metrics
    finally:
        proc.stop()

"""HTTPS serving with client certificates and certificate rotation; request limits answer 429."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from typing import BinaryIO

from harness.pki import make_pki, openssl
from harness.processes import start
from tests.support.httpkube import WatchStream, configmap, get, path_with, request


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
        "serve", "--simulated", "--sim-objects", "5",
        "--tls-cert-file", str(pki["srv.crt"]), "--tls-private-key-file", str(pki["srv.key"]),
        "--client-ca-file", str(pki["ca.crt"]), "--header-timeout", "1",
    )  # fmt: skip
    try:
        port = int(proc.url.rsplit(":", 1)[1])
        assert proc.url.startswith("https://")
        # A client that never completes the TLS handshake is closed after --header-timeout.
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        assert silent.recv(1) == b"" and time.monotonic() - started < 5
        silent.close()
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
    proc = start("serve", "--simulated", "--sim-objects", "5", "--max-watchers", "2")
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


def metric(url: str, name: str) -> float:
    """One sample of ``/metrics`` by its exact name and labels, e.g. ``x_total{limit="y"}``."""
    for line in get(url, "/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def raw(port: int, data: bytes) -> tuple[socket.socket, BinaryIO]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock, sock.makefile("rb")


def status_of(f: BinaryIO) -> tuple[int, dict[str, str], dict]:
    """Status line, headers and JSON body of one Content-Length answer."""
    code = int(f.readline().split(b" ", 2)[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, value = line.decode().split(":", 1)
        headers[name.strip().lower()] = value.strip()
    return code, headers, json.loads(f.read(int(headers["content-length"])))


def test_slow_bodies_get_408_and_request_bytes_are_bounded_before_authentication():
    proc = start(
        "serve", "--simulated", "--sim-objects", "5", "--body-timeout", "0.5",
        "--max-body-bytes", "100000", "--max-request-buffer-bytes", "120000",
    )  # fmt: skip
    try:
        port = int(proc.url.rsplit(":", 1)[1])
        post = b"POST /api/v1/namespaces/ns-0/configmaps HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        # A body that never completes: 408 after --body-timeout, then the connection is closed.
        started = time.monotonic()
        sock, f = raw(port, post + b"Content-Length: 100\r\n\r\n{")
        code, _, body = status_of(f)
        assert code == 408 and body["kind"] == "Status" and body["reason"] == "Timeout"
        assert f.read(1) == b"" and 0.4 < time.monotonic() - started < 5
        sock.close()
        # A client holding 100,000 announced bytes: another body that does not fit is refused with
        # 429 (before it is sent), health probes still answer, and it is all counted.
        holder, _ = raw(port, post + b"Content-Length: 100000\r\n\r\n{")
        deadline = time.monotonic() + 5
        while metric(proc.url, "watchcache_http_request_buffer_bytes") < 100000:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sock, f = raw(port, post + b"Content-Length: 30000\r\nExpect: 100-continue\r\n\r\n")
        code, headers, body = status_of(f)
        assert code == 429 and headers["retry-after"] == "1" and body["reason"] == "TooManyRequests"
        sock.close()
        assert get(proc.url, "/readyz").status == 200
        assert metric(proc.url, 'watchcache_rejected_requests_total{limit="body_timeout"}') == 1
        assert metric(proc.url, 'watchcache_rejected_requests_total{limit="request_buffer"}') == 1
        holder.close()
        deadline = time.monotonic() + 5
        while metric(proc.url, "watchcache_http_request_buffer_bytes") >= 100000:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.stop()


def connect_from(source: str, port: int) -> socket.socket:
    """A connection from another loopback address (127.0.0.0/8), i.e. another client."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def healthz(sock: socket.socket) -> int | None:
    """Status of GET /healthz on ``sock``; None if the connection was closed unanswered."""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        line = sock.makefile("rb").readline()
    except (ConnectionResetError, BrokenPipeError):
        return None
    return int(line.split(b" ", 2)[1]) if line else None


def test_connection_limits_per_client_and_total():
    proc = start(
        "serve", "--simulated", "--sim-objects", "5", "--max-connections-per-client", "2", "--max-connections", "3"
    )
    try:
        port = int(proc.url.rsplit(":", 1)[1])
        a = [connect_from("127.0.0.1", port) for _ in range(2)]
        assert [healthz(s) for s in a] == [200, 200]
        # One more from this address: its first request is answered 429 with Retry-After, then closed.
        sock, f = raw(port, b"GET /api/v1/pods HTTP/1.1\r\nHost: t\r\n\r\n")
        code, headers, body = status_of(f)
        assert code == 429 and headers["retry-after"] == "1" and body["reason"] == "TooManyRequests"
        assert f.read(1) == b""
        sock.close()
        # Another client takes the last place (once the refused connection is gone from the count) ...
        deadline = time.monotonic() + 5
        while healthz(b := connect_from("127.0.0.2", port)) != 200:
            b.close()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # ... and then, over the total, a connection is closed at accept: nothing read, nothing answered.
        over = connect_from("127.0.0.3", port)
        assert healthz(over) is None
        for s in (*a, b, over):
            s.close()
        deadline = time.monotonic() + 5
        while True:
            try:
                assert metric(proc.url, "watchcache_http_connections") == 1  # this scrape's own
                break
            except (AssertionError, ConnectionError, http.client.HTTPException, OSError):
                assert time.monotonic() < deadline  # closes still being processed
                time.sleep(0.05)
        assert metric(proc.url, 'watchcache_rejected_requests_total{limit="connections_per_client"}') == 1
        assert metric(proc.url, 'watchcache_rejected_requests_total{limit="connections"}') >= 1
    finally:
        proc.stop()


def test_waiting_watches_hold_no_seat_until_too_many_wait_and_watch_param_is_not_a_watch():
    # Without flow control: a request finding the seats busy gets 429 at once (with it, it would
    # wait in its queue for the watch's seat: tests/e2e/test_flowcontrol.py).
    proc = start(
        "serve", "--simulated", "--sim-objects", "5", "--max-requests-inflight", "1", "--max-requests-waiting", "1",
        "--fresh-wait", "5", "--no-enable-priority-and-fairness",
    )  # fmt: skip
    waiting: list[http.client.HTTPConnection] = []
    try:
        url = proc.url
        future = int(get(url, "/api/v1/pods").json()["metadata"]["resourceVersion"]) + 1000
        # Two watch-lists waiting for an rv that will not come: the first waits without a seat, the
        # second finds the waiting room full and keeps its seat, the only one. (A watch-list waits for
        # freshness and ends with 504, as kube's; a plain watch from that rv would wait for it.)
        query = {"watch": 1, "resourceVersion": future, "sendInitialEvents": "true",
                 "resourceVersionMatch": "NotOlderThan"}  # fmt: skip
        for _ in range(2):
            conn = http.client.HTTPConnection(*proc.host_port.split(":"), timeout=10)
            conn.request("GET", path_with("/api/v1/pods", **query))
            waiting.append(conn)
        deadline = time.monotonic() + 4
        while True:
            body = get(url, "/metrics").body
            if b'apiserver_current_inflight_requests{request_kind="readOnly"} 1.0' in body and (
                b"watchcache_waiting_requests 1.0" in body
            ):
                break
            assert time.monotonic() < deadline, "the waiting watches do not show as waiting and in flight"
            time.sleep(0.05)
        assert get(url, "/api/v1/pods").status == 429
        # ?watch=1 on a write is a write: it takes its turn like any request (kube: verb "create").
        res = request(url, "POST", "/api/v1/namespaces/default/configmaps?watch=1", configmap("x", "default"))
        assert res.status == 429, res
        # When their wait ends (504 in the stream, after --fresh-wait), the seats are free again.
        for conn in waiting:
            resp = conn.getresponse()
            assert resp.status == 200
            assert json.loads(resp.readline())["object"]["code"] == 504
        assert get(url, "/api/v1/pods").status == 200
    finally:
        for conn in waiting:
            conn.close()
        proc.stop()

"""SIGTERM: what a request still arriving at a draining proxy gets.

Listening stops at SIGTERM, but a client may send on a connection accepted before (client-go keeps
HTTP/1.1 connections alive and sends its next watch on one). Such a request must get 429 with
Retry-After, as kube-apiserver's ``--shutdown-send-retry-after`` answers it — client-go retries a
watch answered 429 from the same resourceVersion — and never an error from a half-stopped process
(a 500 makes client-go's reflector relist: seen in the control-plane restart test, where resumed
pass-through watches hit the upstream session the drain had closed). ``/readyz`` fails meanwhile.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading

from harness.processes import start_stack
from harness.waiting import wait_until
from tests.support.httpkube import get_ok


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict[str, str], bytes]:
    conn.request("GET", path, headers={"Accept": "application/json"})
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def test_a_request_on_a_kept_alive_connection_during_the_drain_gets_429_and_readyz_fails() -> None:
    s = start_stack()
    try:
        host, port = s.proxy.host_port.rsplit(":", 1)
        kept = http.client.HTTPConnection(host, int(port), timeout=10)
        assert _get(kept, "/api/v1/pods?limit=1")[0] == 200  # accepted before SIGTERM, kept alive
        kept_too = http.client.HTTPConnection(host, int(port), timeout=10)
        assert _get(kept_too, "/api/v1/pods?limit=1")[0] == 200
        # Something for the drain to wait for: a read of a resourceVersion the cache does not have yet
        # (it waits up to --fresh-wait, 3 s), so the process is still draining when we ask.
        rv = int(get_ok(s.proxy.url, "/api/v1/pods", limit=1)["metadata"]["resourceVersion"])
        waiting = http.client.HTTPConnection(host, int(port), timeout=30)
        answers: list[int] = []
        reader = threading.Thread(
            target=lambda: answers.append(
                _get(waiting, f"/api/v1/pods?resourceVersion={rv + 100000}&resourceVersionMatch=NotOlderThan")[0]
            ),
            daemon=True,
        )
        reader.start()
        wait_until(lambda: get_ok(s.proxy.url, "/debug/cache")["inflight"] >= 1, 10)
        s.proxy.process.send_signal(signal.SIGTERM)
        # /readyz on the kept connection fails once the drain has begun...
        wait_until(lambda: _get(kept, "/readyz")[0] == 500, 5, interval=0.01)
        status, _, body = _get(kept, "/readyz?verbose")
        assert status == 500 and b"[-]shutdown failed" in body, body
        # ... and a read on it is told to come back, not failed, on a connection the proxy then closes
        # (kube's WithRetryAfter: the client's retry opens a new connection, to another replica).
        status, headers, body = _get(kept, "/api/v1/pods?limit=1")
        assert status == 429, body
        assert headers.get("retry-after") == "1"
        assert headers.get("connection") == "close"
        assert json.loads(body)["reason"] == "TooManyRequests"
        # Another connection accepted before SIGTERM gets the same for a watch.
        status, headers, body = _get(kept_too, "/api/v1/namespaces/ns-0/pods?watch=1&resourceVersion=0")
        assert status == 429 and headers.get("connection") == "close", body
        reader.join(15)
        assert answers == [504]  # the waiting read was answered: its rv never came
        assert s.proxy.process.wait(15) == 0
    finally:
        s.proxy.stop()
        s.sim.stop()

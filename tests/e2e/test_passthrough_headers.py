"""Pass-through keeps the client's header lines: repeated lines stay repeated, hop-by-hop ones go.

Against a local echo upstream; against the real kube-apiserver: tests/reference/test_passthrough_headers.py.
"""

from __future__ import annotations

import json

from harness.processes import Proc, start
from tests.support.echo_upstream import EchoUpstream, raw_request

REVIEW = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
REVIEW_PATH = b"/apis/authentication.k8s.io/v1/selfsubjectreviews"


def _port(proc: Proc) -> int:
    return int(proc.url.rsplit(":", 1)[1])


def test_a_proxy_process_forwards_repeated_lines_and_drops_hop_by_hop_headers() -> None:
    with EchoUpstream() as upstream:
        proxy = start("serve", "--upstream", upstream.url, "--resources", "configmaps", "--workers", "1")
        try:
            head = (
                b"POST " + REVIEW_PATH + b" HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                b"Impersonate-User: x\r\nImpersonate-Group: a\r\nImpersonate-Group: b\r\n"
                b"Connection: X-Hop\r\nX-Hop: secret\r\nContent-Length: %d\r\n\r\n" % len(REVIEW)
            )
            status, lines, body = raw_request("127.0.0.1", _port(proxy), head, REVIEW)
            assert status == 200
            sent = [tuple(line) for line in json.loads(body)["lines"]]
            assert [v for n, v in sent if n == "impersonate-group"] == ["a", "b"]
            assert "x-hop" not in {n for n, _ in sent}
            assert "x-hop-response" not in {n for n, _ in lines}
            assert [v for n, v in lines if n == "warning"] == ['299 - "first"', '299 - "second"']
        finally:
            proxy.stop()

"""Issue 21 item 7: a client that sends its EOF right behind its upgrade request, then reads the rest.

The EOF can arrive before the upstream's 101: the HTTP/1.1 connection then still belongs to
the HTTP layer, which must not close it (the tunnel needs its write side for the answer), and
the EOF must reach the upstream once the tunnel is bridged.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from harness.processes import Proc, start
from tests.support.upgrade_upstream import FakeUpstream


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream()
    yield upstream
    upstream.stop()


@pytest.fixture
def front(fake: FakeUpstream) -> Iterator[Proc]:
    proc = start("serve", "--upstream", fake.url, "--workers", "1")
    yield proc
    proc.stop()


def test_item7_an_eof_sent_with_the_upgrade_request_is_passed_on_and_the_answer_still_arrives(
    fake: FakeUpstream, front: Proc
) -> None:
    url = urlsplit(front.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        head = (
            b"POST /spdy/echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        )
        sock.sendall(head + b"abc")
        sock.shutdown(socket.SHUT_WR)  # stdin ended before the upstream even answered
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head_end = got.find(b"\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 101 "), got
    assert got[head_end + 4 :] == b"abcEOF:3"

"""The open-files limit (service/openfiles.py): raised as Go raises it; connections held below it.

A worker serving kubelets over HTTP/1.1 holds a connection per watch. Started with a soft limit of
1,024 it stopped at about a thousand; at its limit, its own calls to the upstream failed with
"Too many open files" (the kubelets benchmark at 5,000 kubelets: TokenReviews failed, clients got 401).
"""

from __future__ import annotations

import logging
import resource
import socket
import urllib.request
from pathlib import Path

import pytest

from harness.processes import start, wait_ready
from watchcache.http.limits import HttpLimits
from watchcache.service.openfiles import fit_connections

pytestmark = pytest.mark.timeout(90)

_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


@pytest.mark.skipif(
    HARD == resource.RLIM_INFINITY or HARD < 2048, reason=f"needs a hard open-files limit >= 2048, not {HARD}"
)
def test_a_worker_started_with_a_low_soft_limit_raises_it_to_the_hard_one() -> None:
    proc = start("serve", "--simulated", "--sim-objects", "10", nofile=(1024, 2048))
    try:
        assert soft_limit(proc.process.pid) == 2048
    finally:
        proc.stop()


def test_past_its_open_files_the_proxy_closes_new_connections_and_its_upstream_calls_still_work() -> None:
    sim = start("sim", "--objects", "20", "--namespaces", "2")
    # 600 descriptors: at most 600 - 256 client connections; the rest are the proxy's own.
    proxy = start("serve", "--upstream", sim.url, "--resources", "pods", "--workers", "1", nofile=(600, 600))
    conns: list[socket.socket] = []
    try:
        wait_ready(proxy)
        # The default --max-connections is only a ceiling: said at INFO, not as a warning.
        said = [line for line in proxy.log if "at most 344 client connections per worker (open-files limit 600" in line]
        assert len(said) == 1 and " INFO " in said[0], proxy.log
        host, port = proxy.host_port.split(":")
        first = socket.create_connection((host, int(port)))
        conns.append(first)
        for _ in range(640):  # more idle connections than the limit allows, as idle watches, as idle watches' would be
            conns.append(socket.create_connection((host, int(port))))
        # On connections accepted first, reads that pass through (configmaps are not cached) need
        # connections to the upstream, descriptors: a watch holds one, a LIST beside it another.
        first.sendall(b"GET /api/v1/configmaps?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        first.settimeout(20)
        assert first.recv(65536).startswith(b"HTTP/1.1 200"), proxy.log[-20:]
        second = conns[1]
        second.sendall(b"GET /api/v1/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        second.settimeout(20)
        answer = b""
        while chunk := second.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b'"kind":"ConfigMapList"' in answer
        # The connections past the limit were closed at accept, not left to fail later.
        closed = 0
        for c in conns[345:]:
            c.settimeout(5)
            try:
                closed += c.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += 1
        assert closed >= 200
        for c in conns[1:100]:
            c.close()
        with urllib.request.urlopen(proxy.url + "/readyz", timeout=5) as r:  # room again: served
            assert r.status == 200
    finally:
        for c in conns:
            c.close()
        proxy.stop()
        sim.stop()


@pytest.mark.parametrize(
    ("max_connections", "report", "level", "said"),
    [
        (HttpLimits().max_connections, True, logging.INFO, "connections: at most 18000"),  # the default: a ceiling
        (25_000, True, logging.WARNING, "--max-connections 25000 is more than the open-files limit allows"),
        (0, True, logging.WARNING, "--max-connections 0 (no limit) is more than"),
        (25_000, False, None, None),  # not the first worker: the first one said it
        (10_000, True, None, None),  # fits: nothing to say
    ],
    ids=["default-info", "set-warning", "unlimited-warning", "other-worker-silent", "fits-silent"],
)
def test_a_lowered_connection_limit_is_said_once_at_the_level_its_cause_deserves(
    caplog: pytest.LogCaptureFixture, max_connections: int, report: bool, level: int | None, said: str | None
) -> None:
    limits = HttpLimits(max_connections=max_connections)
    with caplog.at_level(logging.DEBUG, logger="watchcache"):
        fitted = fit_connections(limits, 20_000, report=report)
    assert fitted.max_connections == min(max_connections or 18_000, 18_000)
    records = [r for r in caplog.records if r.name == "watchcache"]
    if level is None:
        assert records == []
    else:
        assert [r.levelno for r in records] == [level]
        assert said is not None and said in records[0].getMessage()

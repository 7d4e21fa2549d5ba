"""Issue 34 item 1: a second instance on a port an instance already holds fails at start, whatever its
worker count, and the first one goes on answering every request.

Before, a second ``serve --workers 2`` joined the first one's SO_REUSEPORT group: it logged ready and
took about half of the new connections (against a dead upstream, 10 of 20 LISTs got 429).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import Stack, start_stack

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def first() -> Iterator[Stack]:
    """The instance that holds the port: two workers in front of a simulated cluster."""
    s = start_stack("--workers", "2")
    yield s
    s.proxy.stop()
    s.sim.stop()


def answered_by(url: str) -> tuple[int, int]:
    """(status of a LIST of pods on a new connection, pid of the worker that answered /debug/shards)."""
    with urllib.request.urlopen(url + "/api/v1/pods?limit=5", timeout=10) as resp:
        status = resp.status
    with urllib.request.urlopen(url + "/debug/shards", timeout=10) as resp:
        return status, json.loads(resp.read())["pid"]


def first_pids(stack: Stack) -> set[int]:
    pid = stack.proxy.process.pid
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(pid) for pid in text.split()}


SECOND = {
    "serve --workers 2": ["serve", "--upstream", "{sim}", "--workers", "2"],
    "serve --workers 1": ["serve", "--upstream", "{sim}", "--workers", "1"],
    "serve --simulated": ["serve", "--simulated"],
    "sim": ["sim"],
    "demo": ["demo", "--sim-listen", "127.0.0.1:0"],
}


@pytest.mark.parametrize("second", list(SECOND), ids=list(SECOND))
def test_a_second_instance_on_a_held_port_fails_and_the_first_serves_every_request(first: Stack, second: str) -> None:
    address = first.proxy.host_port
    argv = [a.format(sim=first.sim.url) for a in SECOND[second]] + ["--listen", address]
    workers = first_pids(first)
    assert len(workers) == 2
    results: list[tuple[int, int]] = []
    done = threading.Event()

    def load() -> None:
        # New connections all along the second instance's life: each must reach the first instance.
        while not done.is_set() or len(results) < 20:
            results.append(answered_by(first.proxy.url))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        out = subprocess.run([sys.executable, "-m", "watchcache", *argv], capture_output=True, text=True, timeout=60)
    finally:
        done.set()
        loader.join(60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"watchcache: cannot listen on {address}: address already in use" in out.stderr, out.stderr[-2000:]
    said = out.stdout + out.stderr
    assert "Traceback" not in said and "ready: listening" not in said and "is ready" not in said, said[-2000:]
    assert {status for status, _ in results} == {200}
    assert {pid for _, pid in results} <= workers, "a request reached a process of the second instance"
    for _ in range(20):
        with urllib.request.urlopen(first.proxy.url + "/readyz", timeout=10) as resp:
            assert resp.status == 200

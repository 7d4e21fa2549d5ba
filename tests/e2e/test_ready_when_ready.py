"""Issue 34 item 3, through real processes: ``ready`` is logged only once ``/readyz`` answers 200; a serving
certificate that cannot be read stops the start; ``watchcache demo`` fails when one of its parts does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import Proc, python_m, start, wait_logged

pytestmark = pytest.mark.timeout(120)


def readyz(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def refusing_port() -> Iterator[socket.socket]:
    """A port of ours that refuses connections (bound, not listening) until the test makes it listen."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unreachable_upstream_is_serving_not_ready_then_ready_once_it_answers(
    refusing_port: socket.socket, workers: str
) -> None:
    port = refusing_port.getsockname()[1]
    proxy = start("serve", "--upstream", f"http://127.0.0.1:{port}", "--workers", workers, "--resources", "pods")
    sim: subprocess.Popen[bytes] | None = None
    try:
        line = wait_logged(proxy, lambda text: "serving, not ready: " in text)
        assert "upstream discovery failed (refused)" in line, line
        assert f"nothing accepts connections at http://127.0.0.1:{port}" in line, line
        assert readyz(proxy.url) == 500
        assert not any("ready: listening" in text for text in proxy.log), "".join(proxy.log)
        # The upstream comes up, on that very port (the socket handed to it: no other process can take it).
        refusing_port.listen(16)
        fd = refusing_port.fileno()
        sim = subprocess.Popen(
            [sys.executable, "-m", "watchcache", "sim", "--listen", f"127.0.0.1:{port}", "--listen-fd", str(fd)],
            pass_fds=(fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        ready = wait_logged(proxy, lambda text: "ready: listening on" in text and "not ready" not in text, 60)
        assert proxy.url in ready
        assert readyz(proxy.url) == 200
        if workers == "2":
            wait_logged(proxy, lambda text: "watchcache serve ready: listening on" in text and "2 workers" in text)
    finally:
        proxy.stop()
        if sim is not None:
            sim.send_signal(signal.SIGTERM)
            sim.wait(10)
    said = "".join(proxy.log)
    # At most once per process, not once per retry (a worker that started after the upstream came up says none).
    assert 1 <= said.count("serving, not ready") <= int(workers), said


def test_a_ready_line_is_logged_only_with_readyz_200(tmp_path: Path) -> None:
    """The simulated cluster is ready at once: its ready line comes, and /readyz agrees."""
    proc = start("serve", "--simulated", "--sim-objects", "5")
    try:
        assert any(re.search(r"watchcache serve ready: listening on http://", line) for line in proc.log)
        assert readyz(proc.url) == 200
        assert not any("not ready" in line for line in proc.log)
    finally:
        proc.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_serving_certificate_that_cannot_be_read_stops_the_start(tmp_path: Path, workers: str) -> None:
    missing = tmp_path / "tls.crt"
    out = subprocess.run(
        [sys.executable, "-m", "watchcache", "serve", "--upstream", "http://127.0.0.1:1", "--workers", workers,
         "--listen", "127.0.0.1:0", "--tls-cert-file", str(missing), "--tls-private-key-file", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"--tls-cert-file {missing}" in out.stderr and "No such file or directory" in out.stderr, out.stderr
    assert out.stderr.count("No such file") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "ready" not in out.stderr.replace("already", ""), out.stderr


# ----------------------------------------------------------------------------------------------- demo


DEMO_READY = re.compile(r"watchcache is ready at (http://\S+)")


class Demo(Proc):
    """``watchcache demo``: its ready line names the proxy's URL (and the simulator's)."""

    def __init__(self, *args: str) -> None:
        super().__init__(python_m("watchcache", "demo", "--objects", "20", *args), name="demo", ready=DEMO_READY)
        self.start()

    def parts(self) -> dict[str, int]:
        """The demo's children by subcommand (sim, serve)."""
        pid = self.process.pid
        out = {}
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            out[argv[3].decode()] = int(child)
        return out


@pytest.fixture
def other_sim() -> Iterator[Proc]:
    proc = start("sim", "--objects", "3")
    yield proc
    proc.stop()


def test_demo_on_a_busy_sim_address_fails_without_saying_ready(other_sim: Proc) -> None:
    """Before, it polled the other process's simulator, said 'watchcache is ready' and exited 0."""
    demo = Demo("--listen", "127.0.0.1:0", "--sim-listen", other_sim.host_port)
    code = demo.process.wait(60)
    said = "".join(demo.log)
    demo.stop()
    assert code == 2, said
    assert f"watchcache: cannot listen on {other_sim.host_port}: address already in use" in said, said
    assert "is ready" not in said and "Traceback" not in said, said


def test_demo_exits_non_zero_when_a_part_dies_and_zero_when_stopped() -> None:
    demo = Demo("--listen", "127.0.0.1:0", "--sim-listen", "127.0.0.1:0")
    try:
        url = demo.wait_ready(90)
        assert readyz(url) == 200
        os.kill(demo.parts()["serve"], signal.SIGKILL)
        assert demo.process.wait(30) == 1
        assert any("watchcache demo: the proxy exited (exit -9)" in text for text in demo.log), "".join(demo.log)
    finally:
        demo.stop()
    clean = Demo("--listen", "127.0.0.1:0", "--sim-listen", "127.0.0.1:0")
    try:
        clean.wait_ready(90)
        time.sleep(0.5)
        clean.process.send_signal(signal.SIGTERM)
        assert clean.process.wait(30) == 0, "".join(clean.log)
    finally:
        clean.stop()

"""Issue 21 item 7: `serve --workers N` leaves nothing behind, whichever way it ends.

- A start that fails (its port is taken) removes its ``watchcache-*`` shard directory.
- Workers do not outlive a supervisor that was killed, even one killed as they were forked (the
  parent check read its parent once its worker was started: by then already init).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import running

pytestmark = pytest.mark.timeout(60)


def shard_dirs(tmp: Path) -> set[str]:
    return {p.name for p in tmp.glob("watchcache-*")}


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


@pytest.fixture
def silent_upstream() -> Iterator[str]:
    """Accepts connections and never answers: a first LIST that never completes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_item7_a_start_that_fails_on_a_taken_port_leaves_no_shard_directory(
    tmp_path: Path, silent_upstream: str
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "watchcache", "serve", "--upstream", silent_upstream, "--workers", "2",
             "--listen", f"127.0.0.1:{port}"],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        taken.close()
    assert result.returncode != 0
    assert "Address already in use" in result.stderr or "in use" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert shard_dirs(tmp_path) == set()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to find the workers")
def test_item7_workers_that_are_still_starting_exit_when_the_supervisor_is_killed(
    tmp_path: Path, silent_upstream: str
) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "watchcache", "serve", "--upstream", silent_upstream, "--workers", "2",
         "--listen", "127.0.0.1:0"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while len(workers) < 2:
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.005)
            workers = children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # at once: the workers have only just been forked
        proc.wait(5)
        deadline = time.monotonic() + 10
        while any(running(w) for w in workers):
            assert time.monotonic() < deadline, f"orphaned workers {[w for w in workers if running(w)]}"
            time.sleep(0.1)
    finally:
        for w in workers:
            if running(w):
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_tempfile_honours_tmpdir(tmp_path: Path) -> None:
    """What the tests above rely on: the shard directory is made under $TMPDIR."""
    code = "import tempfile; print(tempfile.gettempdir())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert out == str(tmp_path) and tempfile.gettempdir() != ""

"""Processes of the chaos campaign: the simulated cluster, the relay, the sharded proxy.

Each process logs to a file in the campaign's directory; ``Proc.wait_ready`` reads the
``ready: listening on http://H:P`` line from the part of the log written since it started,
so a process restarted on the same port (same log file, appended) is recognised anew.
Every wait is bounded; processes are stopped by their own pid only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(rb"ready: listening on (http://[\d.]+:\d+)(?: control (http://[\d.]+:\d+))?")
SUPERVISOR_READY = re.compile(rb"watchcache serve ready: listening on (https?://[\d.]+:\d+)")
RELISTED = re.compile(r"relisted (\S+) at rv (\d+)")
LOG_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
CAUGHT_UP = re.compile(r"following (\S+): caught up at rv (\d+)")


class StackError(RuntimeError):
    pass


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    ready_re: re.Pattern[bytes] = READY
    process: subprocess.Popen[bytes] | None = None
    url: str = ""
    control_url: str = ""
    _offset: int = 0
    starts: list[float] = field(default_factory=list)
    # Its own process group (session), so that the whole group can be killed at once (a container kill).
    new_session: bool = False

    def start(self) -> None:
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=self.new_session
            )
        finally:
            log.close()
        self.starts.append(time.monotonic())

    def wait_ready(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.log_path.read_bytes()[self._offset :]
            m = self.ready_re.search(data)
            if m:
                self.url = m.group(1).decode()
                if m.lastindex and m.lastindex >= 2 and m.group(2):
                    self.control_url = m.group(2).decode()
                return self.url
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log_path.read_bytes()[self._offset :][-3000:].decode("utf-8", "replace")
        raise StackError(f"{self.name} did not become ready:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                return None
        return self.process.returncode


def python_m(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def sim_argv(listen: str, state_file: Path, *, objects: int, namespaces: int, churn: float, seed: int) -> list[str]:
    argv = python_m(
        "watchcache", "sim", "--listen", listen, "--objects", str(objects), "--namespaces", str(namespaces),
        "--state-file", str(state_file), "--bookmark-interval", "1", "--seed", str(seed),
    )  # fmt: skip
    if churn > 0:
        argv += ["--churn", str(churn)]
    return argv


def proxy_argv(listen: str, upstream: str, *, workers: int, stall_timeout: float, extra: list[str]) -> list[str]:
    return python_m(
        "watchcache", "serve", "--listen", listen, "--upstream", upstream, "--workers", str(workers),
        "--stall-timeout", str(stall_timeout), "--bookmark-interval", "1", "--resources", "pods,configmaps",
        *extra,
    )  # fmt: skip


def relay_argv(target: str) -> list[str]:
    return python_m("loadtest.chaos.relay", "--listen", "127.0.0.1:0", "--target", target, "--control", "127.0.0.1:0")


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def relist_points(log_path: Path) -> dict[str, set[int]]:
    """The rvs at which the proxy delivered a relist diff, per resource (reflector relists, follower resyncs)."""
    out: dict[str, set[int]] = {}
    if not log_path.exists():
        return out
    for line in log_path.read_text("utf-8", "replace").splitlines():
        for pattern in (RELISTED, CAUGHT_UP):
            m = pattern.search(line)
            if m:
                out.setdefault(m.group(1), set()).add(int(m.group(2)))
    return out


def relist_times(log_path: Path) -> dict[str, list[tuple[float, int]]]:
    """(wall-clock time, rv) of every reflector relist in the proxy's log, per resource: each one the
    upstream forced (its 410). Follower resyncs (``caught up``) are not: a follower resyncs when its
    owner's stream breaks, which is the proxy's own doing."""
    out: dict[str, list[tuple[float, int]]] = {}
    if not log_path.exists():
        return out
    for line in log_path.read_text("utf-8", "replace").splitlines():
        m = RELISTED.search(line)
        if m and LOG_TIME.match(line):
            when = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            out.setdefault(m.group(1), []).append((when, int(m.group(2))))
    return out


def journal_heads(path: Path) -> dict[str, int]:
    """The rv of the last write of each resource in the journal (complete lines only)."""
    out: dict[str, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n") or not line.startswith(b'{"rv":'):
                continue
            comma = line.index(b",")
            rv = int(line[6:comma])
            start = comma + 6  # ,"r":"
            resource = line[start : line.index(b'"', start)].decode()
            out[resource] = rv
    return out


def last_journal_rv(path: Path) -> int:
    """The rv of the last complete line of the journal (0 if empty)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 20)))
        lines = f.read().split(b"\n")
    for line in reversed(lines[:-1] if lines and lines[-1] else lines):
        if line.startswith(b'{"rv":'):
            return int(line[6 : line.index(b",")])
    return 0

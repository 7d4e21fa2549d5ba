"""Real ``watchcache`` processes on real sockets, for every tier that starts one.

Each process listens on port 0 and :func:`start` reads the chosen port from its ``ready`` log
line, so tests run in parallel without port clashes.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# "ready: listening on URL", or "serving, not ready: REASON; listening on URL" (service/readiness.py).
READY = re.compile(r"listening on (https?://[\d.]+:\d+)")


@dataclass
class Proc:
    url: str
    process: subprocess.Popen
    log: list[str] = field(default_factory=list)

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def stop(self, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return self.process.returncode


def start(*args: str, timeout: float = 30.0, nofile: tuple[int, int] | None = None) -> Proc:
    """Start ``watchcache ARGS --listen 127.0.0.1:0`` and wait for its ready (or serving, not ready) line.

    ``nofile``: the (soft, hard) open-files limit it starts with."""
    cmd = [sys.executable, "-m", "watchcache", *args, "--listen", "127.0.0.1:0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def limits() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=limits
    )
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line)
            m = READY.search(line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found and process.poll() is None and time.monotonic() < deadline:
        ready.wait(0.1)
    if not found:
        process.kill()
        raise RuntimeError("watchcache did not become ready:\n" + "".join(log))
    return Proc(found[0], process, log)


def wait_ready(proc: Proc, timeout: float = 30.0) -> None:
    """Poll /readyz until 200 (a proxy listens before its caches have synced)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(proc.url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError("not ready in time:\n" + "".join(proc.log[-30:]))


@dataclass
class Stack:
    """``watchcache sim`` as the upstream and ``watchcache serve --upstream`` in front of it."""

    sim: Proc
    proxy: Proc


def start_stack(*proxy_args: str, sim_args: tuple[str, ...] = ("--objects", "120", "--namespaces", "3")) -> Stack:
    sim = start("sim", *sim_args)
    try:
        proxy = start("serve", "--upstream", sim.url, *proxy_args)
        wait_ready(proxy)
    except BaseException:
        sim.stop()
        raise
    return Stack(sim, proxy)


def proc_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def logged(proc: Proc, text: str) -> bool:
    return any(text in line for line in proc.log)


def wait_logged(proc: Proc, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
    """The first log line that matches, waiting for it: the log is read from the process's pipe by
    another thread, so a line the process wrote may not be in ``proc.log`` yet."""
    deadline = time.monotonic() + timeout
    while True:
        found = next((line for line in list(proc.log) if predicate(line)), None)
        if found is not None:
            return found
        assert time.monotonic() < deadline, "not logged:\n" + "".join(proc.log[-20:])
        time.sleep(0.05)

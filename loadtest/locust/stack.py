"""A throwaway stack for a load test: ``watchcache demo`` (the simulated cluster plus the proxy in
front of it) on free ports, started and stopped by the runner.

``demo`` needs fixed ports (it polls each process's /readyz): the caller's (``make loadtest
LISTEN=… SIM_LISTEN=…``), or free ones picked by binding port 0 and releasing it; another
process can grab one in between, so a start on free ports that fails early is retried on
fresh ones.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

READY = re.compile(r"watchcache is ready at (http://\S+) \(simulated cluster at (http://[^)\s]+)\)")
ATTEMPTS = 3


@dataclass
class Stack:
    proxy_url: str
    upstream_url: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM ``demo`` (it stops both children); the process group is killed only if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # our own session: demo and its two children
                self.process.wait()
        return self.process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    *,
    objects: int = 1000,
    namespaces: int = 10,
    churn: float = 5.0,
    timeout: float = 90.0,
    log_file: Path | None = None,
    listen: str = "",
    sim_listen: str = "",
) -> Stack:
    """Start ``demo`` on ``listen``/``sim_listen``, each a free port when empty.

    Only a start on free ports is retried (on fresh ones): a port the caller chose that is busy
    would fail the same way again.
    """
    attempts = 1 if listen and sim_listen else ATTEMPTS
    last = ""
    for _ in range(attempts):
        ports = (listen or f"127.0.0.1:{free_port()}", sim_listen or f"127.0.0.1:{free_port()}")
        try:
            return _start_once(objects, namespaces, churn, timeout, log_file, *ports)
        except RuntimeError as e:
            last = str(e)
    raise RuntimeError(f"watchcache demo did not start in {attempts} attempt(s):\n{last}")


def _start_once(
    objects: int, namespaces: int, churn: float, timeout: float, log_file: Path | None, listen: str, sim_listen: str
) -> Stack:
    cmd = [
        sys.executable,
        "-m",
        "watchcache",
        "demo",
        "--listen",
        listen,
        "--sim-listen",
        sim_listen,
        "--objects",
        str(objects),
        "--namespaces",
        str(namespaces),
        "--churn",
        str(churn),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    sink: IO[str] | None = log_file.open("w") if log_file else None
    log: list[str] = []
    found: list[tuple[str, str]] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if sink is not None:
                sink.write(line)
                sink.flush()
            if len(log) < 2000:
                log.append(line)
            m = READY.search(line)
            if m and not found:
                found.append((m.group(1), m.group(2)))
                ready.set()
        ready.set()
        if sink is not None:
            sink.close()

    threading.Thread(target=pump, daemon=True, name="demo-log").start()
    deadline = time.monotonic() + timeout
    while not found and process.poll() is None and time.monotonic() < deadline:
        ready.wait(0.1)
    if not found:
        stack = Stack("", "", process, log)
        stack.stop(5.0)
        raise RuntimeError("".join(log[-40:]))
    return Stack(found[0][0], found[0][1], process, log)

"""A throwaway stack for a load test: ``watchcache demo`` (the simulated cluster plus the proxy in
front of it) on free ports, started and stopped by the runner.

``demo`` needs fixed ports (it polls each process's /readyz): the caller's (``make loadtest
LISTEN=… SIM_LISTEN=…``), or free ones picked by binding port 0 and releasing it; another
process can grab one in between, so a start on free ports that fails early is retried on
fresh ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.processes import NotReady, Proc, free_port, python_m

READY = re.compile(r"watchcache is ready at (http://\S+) \(simulated cluster at (http://[^)\s]+)\)")
ATTEMPTS = 3


@dataclass
class Stack:
    proxy_url: str
    upstream_url: str
    demo: Proc

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM ``demo`` (it stops both children); its session is killed only if it hangs."""
        return self.demo.stop(timeout)


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
        except NotReady as e:
            last = str(e)
    raise RuntimeError(f"watchcache demo did not start in {attempts} attempt(s):\n{last}")


def _start_once(
    objects: int, namespaces: int, churn: float, timeout: float, log_file: Path | None, listen: str, sim_listen: str
) -> Stack:
    argv = python_m(
        "watchcache", "demo", "--listen", listen, "--sim-listen", sim_listen, "--objects", str(objects),
        "--namespaces", str(namespaces), "--churn", str(churn),
    )  # fmt: skip
    if log_file is not None:
        log_file.write_bytes(b"")  # this run's log only
    demo = Proc(argv, name="demo", ready=READY, log_path=log_file, new_session=True).up(timeout)
    return Stack(demo.url, demo.group(2), demo)

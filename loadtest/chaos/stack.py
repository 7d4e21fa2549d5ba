"""Processes of the chaos campaign: the command lines of the simulated cluster, the relay and the
sharded proxy, and what the sim's journal says (what the proxy's log says is harness/proxylog.py).

Each one runs as a ``harness.processes.Proc`` logging to a file in the campaign's directory: a
process restarted on the same port (same log file, appended) is recognised anew by its ready line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.processes import python_m

# The relay's ready line names its control endpoint too: ``Proc.group(2)``.
RELAY_READY = re.compile(r"ready: listening on (http://[\d.]+:\d+)(?: control (http://[\d.]+:\d+))?")


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
    return python_m("harness.relay", "--listen", "127.0.0.1:0", "--target", target, "--control", "127.0.0.1:0")


def host_port(url: str) -> str:
    return url.removeprefix("http://")


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

"""What a proxy's log says about relists: the rvs where its reflectors relisted (the upstream's 410)
and where its followers resynced (their owner's stream broke), per resource. The chaos campaign and
the tiers test read them to tell a relist the upstream forced from one the proxy caused.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

# watchcache's own log lines (upstream/reflector.py, shard/follower.py).
RELISTED = re.compile(r"relisted (\S+) at rv (\d+)")
CAUGHT_UP = re.compile(r"following (\S+): caught up at rv (\d+)")
LOG_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def relist_points(log_path: Path) -> dict[str, set[int]]:
    """The rvs at which the proxy delivered a relist diff, per resource (reflector relists, follower resyncs)."""
    if not log_path.exists():
        return {}
    return relist_points_in(log_path.read_text("utf-8", "replace").splitlines())


def relist_points_in(lines: Iterable[str]) -> dict[str, set[int]]:
    """``relist_points`` of log lines (e.g. several processes' ``Proc.log``)."""
    out: dict[str, set[int]] = {}
    for line in lines:
        for pattern in (RELISTED, CAUGHT_UP):
            m = pattern.search(line)
            if m:
                out.setdefault(m.group(1), set()).add(int(m.group(2)))
    return out


def log_time(line: str) -> float | None:
    """The wall-clock time a watchcache log line is stamped with (its local time), None if it has no stamp."""
    if not LOG_TIME.match(line):
        return None
    return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000


def lines_near(log_path: Path, when: float, before: float = 3.0, after: float = 1.0, limit: int = 20) -> list[str]:
    """The proxy's log lines stamped within [when - before, when + after] (wall clock): what it said
    around a client's 410, for a report that must explain one."""
    if not log_path.exists():
        return []
    out = []
    for line in log_path.read_text("utf-8", "replace").splitlines():
        t = log_time(line)
        if t is not None and when - before <= t <= when + after:
            out.append(line[:300])
    return out[-limit:]


def relist_times(log_path: Path) -> dict[str, list[tuple[float, int]]]:
    """(wall-clock time, rv) of every reflector relist in the proxy's log, per resource: each one the
    upstream forced (its 410). Follower resyncs (``caught up``) are not: a follower resyncs when its
    owner's stream breaks, which is the proxy's own doing."""
    out: dict[str, list[tuple[float, int]]] = {}
    if not log_path.exists():
        return out
    for line in log_path.read_text("utf-8", "replace").splitlines():
        m = RELISTED.search(line)
        t = log_time(line) if m else None
        if m and t is not None:
            out.setdefault(m.group(1), []).append((t, int(m.group(2))))
    return out

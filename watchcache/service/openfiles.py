"""The open-files limit: every HTTP/1.1 watch is a connection, and a connection is a file descriptor.

kube-apiserver, like every Go program since Go 1.19, raises its soft ``RLIMIT_NOFILE`` to the hard
limit at start. A Python process does not: started from a login shell or by systemd, it keeps the
soft limit of 1,024, and a worker would stop at about a thousand kubelet watches, the next
connections reset by uvloop's accept (``EMFILE``) and the proxy's own calls to the upstream
(reviews, pass-through) failing with "Too many open files". So the serving commands raise the soft
limit as Go does, and ``--max-connections`` is held below what the limit allows, leaving room for
the upstream's connections: past it a connection is closed at accept, counted, rather than
accepted and reset, and the upstream calls keep working.
"""

from __future__ import annotations

import dataclasses
import logging
import resource

from watchcache.http.limits import HttpLimits

log = logging.getLogger("watchcache")

# Descriptors kept for the proxy's own side: reflectors' watches, review and pass-through pools,
# files, the shard stream, tunnels' upstream halves (a tunnel holds two). At least this many,
# or a tenth of the limit.
RESERVED = 256


def raise_open_files_limit() -> int:
    """The soft limit raised to the hard one, as Go does; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):  # e.g. an infinite hard limit above the kernel's nr_open
            return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fit_connections(limits: HttpLimits, open_files: int, *, report: bool = True) -> HttpLimits:
    """``limits`` with ``max_connections`` no higher than ``open_files`` allows (see the module docstring).

    Said once per group (``report``: the first worker; every worker has the same limit and flags):
    at WARNING when ``--max-connections`` was set to more than the limit allows (the flag cannot be
    honoured: lower it, or raise the limit); at INFO when it is the default, which is only a ceiling
    (a hard limit of 20,000 leaves 18,000 connections per worker: nothing to act on).
    """
    if open_files == resource.RLIM_INFINITY:
        return limits
    room = max(open_files - max(RESERVED, open_files // 10), 1)
    if limits.max_connections and limits.max_connections <= room:
        return limits
    if report:
        requested = limits.max_connections != HttpLimits().max_connections
        log.log(
            logging.WARNING if requested else logging.INFO,
            "%s: at most %d client connections per worker (open-files limit %d, %d kept for the upstream's), "
            "the rest closed at accept; to serve more, raise the hard limit (LimitNOFILE= in a systemd unit, "
            "ulimit -Hn, the container runtime's nofile)",
            f"--max-connections {limits.max_connections or '0 (no limit)'} is more than the open-files limit allows"
            if requested
            else "connections",
            room,
            open_files,
            open_files - room,
        )
    return dataclasses.replace(limits, max_connections=room)

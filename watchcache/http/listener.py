"""The public listening socket: bound once, by one process, and owned by one instance.

A process group shares it the way gunicorn's arbiter does: the supervisor binds and listens, and
its workers inherit the socket (forked, or started with the descriptor passed on) and accept on it.
The socket is bound *without* ``SO_REUSEPORT``, so the kernel refuses the address to anything else
while it is open: a second ``watchcache serve`` (whatever its worker count), a stale process during
a restart, or another program. Workers that each bound their own ``SO_REUSEPORT`` socket could not
tell a sibling from a stranger: any process of the same user joins such a group, and did, silently
taking half of the new connections. Inheriting also keeps the port open while a worker restarts
(connections wait in the backlog instead of being refused, or reset with a dead worker's queue) and
resolves port 0 once for the whole group. ``SO_REUSEADDR`` is set, as every server does, so that a
restart is not refused for the previous instance's connections in TIME_WAIT; on Linux it never
lets two sockets listen on one address.

What it costs: one accept queue goes to whichever worker wakes first, not by SO_REUSEPORT's hash.
Measured with 2 workers (commit c886e42): 400 watches opened at once split 200/200 (SO_REUSEPORT:
207/193); 200 one-at-a-time requests to an idle group 152/48 (SO_REUSEPORT: 99/101). A busy worker
is not waiting for the next connection, so under load the idler worker should take more (expected,
not measured here).
"""

from __future__ import annotations

import errno
import socket

__all__ = ["BACKLOG", "ListenError", "bind_listener", "inherited_listener"]

# Connections the kernel queues before a worker accepts them (somaxconn caps it).
BACKLOG = 2048


class ListenError(OSError):
    """The address cannot be ours: taken, not local, or not allowed. The message says which."""


def _explain(host: str, port: int, e: OSError) -> str:
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    if e.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: address already in use: another process (another watchcache "
            f"instance?) holds it; `ss -ltnp 'sport = :{port}'` names it"
        )
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: no interface of this host has that address"
    if e.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need CAP_NET_BIND_SERVICE)"
    return f"cannot listen on {where}: {e.strerror or e}"


def bind_listener(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), exclusively; ``ListenError`` if not.

    A host name listens on its first address (as ``getaddrinfo`` orders them)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise ListenError(_explain(host, port, e)) from None
    sock.setblocking(False)
    return sock


def inherited_listener(fd: int) -> socket.socket:
    """The listening socket a parent opened and handed down at descriptor ``fd``."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise ListenError(f"--listen-fd {fd}: not an open socket: {e.strerror or e}") from None
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0:
        sock.detach()
        raise ListenError(f"--listen-fd {fd}: the socket does not listen")
    sock.setblocking(False)
    return sock

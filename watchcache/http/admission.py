"""What every connection of one HTTP server shares: how many there are, and the request bytes they hold.

These limits hold before authentication (the handler authenticates), so they are what a
client that is nobody can cost the process: a file descriptor and a parser per connection,
and the bytes of the requests it has sent that are not answered yet (heads, bodies, pipelined
requests). Counted in plain integers by the connections themselves; read at scrape time
(:mod:`watchcache.metrics`).
"""

from __future__ import annotations

__all__ = ["LIMITS", "Admission"]

#: Rejection counters, by the limit that refused (the ``limit`` label of the metric).
LIMITS = (
    "connections",
    "connections_per_client",
    "request_buffer",
    "header_timeout",
    "body_timeout",
    # Bytes waiting for a client that took none of them for --request-timeout: connection closed.
    "send_timeout",
    # HTTP/2 (watchcache.http.h2protocol): a stream refused (431, 400 for an upgrade) or reset, a
    # connection closed with GOAWAY (streams, rapid reset, control frames, protocol errors), or
    # ended after an unauthenticated request.
    "http2_header_list",
    "http2_upgrade",
    "http2_streams",
    "http2_rapid_reset",
    "http2_control_flood",
    "http2_protocol",
    "http2_unauthenticated",
)


class Admission:
    """Open connections (total and per client address) and request bytes held, for one server."""

    __slots__ = (
        "buffered",
        "by_client",
        "connections",
        "h2_connections",
        "h2_streams",
        "max_buffered",
        "max_connections",
        "max_per_client",
        "rejected",
    )

    def __init__(self, max_connections: int = 0, max_per_client: int = 0, max_buffered: int = 0) -> None:
        # 0: no limit.
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.max_buffered = max_buffered or 1 << 62
        self.connections = 0
        self.by_client: dict[str, int] = {}
        # Bytes of requests received (or, for a declared Content-Length, accepted to receive)
        # and not answered yet, over all connections.
        self.buffered = 0
        self.rejected: dict[str, int] = dict.fromkeys(LIMITS, 0)
        # Of ``connections``, those speaking HTTP/2, and their streams open now.
        self.h2_connections = 0
        self.h2_streams = 0

    def connect(self, client: str) -> str | None:
        """Count a new connection from ``client`` (an address); the limit it is over, or None.

        Over ``max_connections`` it is not counted (the caller closes it at once); over the
        per-client limit it is counted until it closes, as it holds a descriptor meanwhile.
        """
        if self.max_connections and self.connections >= self.max_connections:
            self.rejected["connections"] += 1
            return "connections"
        self.connections += 1
        count = self.by_client.get(client, 0) + 1
        self.by_client[client] = count
        if self.max_per_client and client and count > self.max_per_client:
            self.rejected["connections_per_client"] += 1
            return "connections_per_client"
        return None

    def disconnect(self, client: str) -> None:
        self.connections -= 1
        count = self.by_client[client] - 1
        if count:
            self.by_client[client] = count
        else:
            del self.by_client[client]  # so the map does not grow with every address ever seen

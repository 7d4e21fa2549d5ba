"""What a client may cost the server before anyone knows who it is: the HTTP limits, with a reason per field.

Plain frozen data, so that the command line (``service.options``) builds them without loading a
protocol. :class:`HttpLimits` hold on both protocols (on HTTP/2, per stream where they are about
one request); :class:`H2Limits` are HTTP/2's own. docs/security.md lists each with kube's value.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchcache.http.admission import Admission

__all__ = ["H2Limits", "HttpLimits"]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int = 1 << 20  # request line + header bytes; over -> 431
    max_body_bytes: int = 3 * 1024 * 1024  # over -> 413 (kube-apiserver's limit)
    header_timeout: float = 10.0  # to receive a complete request head (slowloris) -> close
    # To receive a request body once its head is in (slow bodies) -> 408, close. kube-apiserver's
    # request timeout (60 s) covers reading the body too.
    body_timeout: float = 60.0
    keepalive_timeout: float = 90.0  # idle between requests -> close
    # Bytes waiting for a client that takes none of them for this long -> the connection is closed
    # (HTTP/1.1: after its last answer; HTTP/2: when no stream's bytes move). --request-timeout; 0: never.
    send_timeout: float = 60.0
    high_water: int = 256 * 1024  # transport write buffer marks for pause/resume
    low_water: int = 64 * 1024
    # Open connections per server (process); over -> closed at accept. 0: no limit.
    max_connections: int = 20_000
    # Per client address; over -> its first request gets 429 + Retry-After, then close. 0: no limit,
    # the default, as kube-apiserver: behind a load balancer that rewrites source addresses every
    # kubelet of a cluster comes from a few addresses, and any per-address cap would cap the cluster
    # (docs/security.md, "Why no per-client connection limit by default").
    max_connections_per_client: int = 0
    # Request bytes (heads and bodies) one connection may hold unanswered; over -> it is not read
    # until its earlier requests are answered. Never below one request of the largest size.
    max_connection_buffer_bytes: int = 4 << 20
    # The same over all connections; over -> 429 + Retry-After (probes excepted). 0: no limit.
    max_request_buffer_bytes: int = 256 << 20

    def admission(self) -> Admission:
        """The shared state of one server's connections under these limits."""
        return Admission(self.max_connections, self.max_connections_per_client, self.max_request_buffer_bytes)

    @property
    def connection_buffer_cap(self) -> int:
        """Request bytes one connection may hold: never below one request of the largest size."""
        return max(self.max_connection_buffer_bytes, self.max_header_bytes + self.max_body_bytes)


@dataclass(frozen=True, slots=True)
class H2Limits:
    """HTTP/2's own limits; the HTTP/1.1 ones (header and body sizes, timeouts) apply per stream too."""

    # SETTINGS_MAX_CONCURRENT_STREAMS: kube-apiserver's --http2-max-streams-per-connection default,
    # which is also what Go clients assume before they see it. Each watch holds one for its life.
    max_concurrent_streams: int = 100
    # The request-body window of a stream: kube's MaxUploadBufferPerStream (256 KiB, "99% of
    # resources"); the connection's is that times the stream limit (kube's MaxUploadBufferPerConnection).
    initial_window_size: int = 256 * 1024
    # Streams reset by the client before their answer completed (rapid reset): a burst, then a rate.
    # A controller stopping its informers resets each watch once: 2x the stream limit in a burst.
    reset_burst: int = 200
    reset_rate: float = 100.0
    # PING, SETTINGS, PRIORITY and empty DATA frames: each costs us a frame or work and carries nothing.
    control_burst: int = 1000
    control_rate: float = 100.0
    # Control frames answered (ACKs) while the transport is paused (Go's maxQueuedControlFrames).
    max_queued_control_frames: int = 10_000

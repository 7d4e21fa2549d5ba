"""A token bucket: how the proxy bounds what clients can set off, whatever drives them.

One shape for every rate limit: consistency probes toward the upstream (``upstream/probes.py``),
HTTP/2 stream resets and control frames from a client (``http/h2protocol.py``).
"""

from __future__ import annotations


class TokenBucket:
    """``rate`` takes per second on average, ``burst`` at once; the caller's clock (``now``)."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(max(1, burst))
        self._tokens = self.burst
        self._at = now

    def take(self, now: float) -> float:
        """0 if a take is allowed now (and counted), else the seconds until one would be."""
        tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return 0.0
        self._tokens = tokens
        return (1.0 - tokens) / self.rate

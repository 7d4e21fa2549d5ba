"""Fault injection for the simulated cluster, so reliability tests can break the upstream on purpose.

``POST /sim/faults`` with ``{"kind": ..., "seconds": S}``:

* ``error`` (with ``"code": 500|429|503``): every API request answers that Status for S seconds
  (429 and 503 carry ``Retry-After: 1``), as an overloaded or failing apiserver does;
* ``stall``: open watch streams stop receiving bytes for S seconds but stay connected (their
  frames wait in each watcher's bounded buffer), as a wedged apiserver or a black-holed
  network path does — the proxy must notice the silence and reconnect;
* ``compact``: compact every resource's history and end every watch (``POST /sim/compact``).

``DELETE /sim/faults`` clears them. Faults end by themselves after their duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from watchcache import apierrors
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.watchers.flush import FlushScheduler

Handler = Callable[[Request, Response], object]


class FaultInjector:
    """Wraps the sim's API handler; the clock is injectable for tests."""

    def __init__(self, flusher: FlushScheduler, clock: Callable[[], float] = time.monotonic) -> None:
        self.flusher = flusher
        self.clock = clock
        self.error_code = 0
        self.error_until = 0.0
        self.stall_until = 0.0

    def active_error(self) -> int:
        if self.error_code and self.clock() < self.error_until:
            return self.error_code
        return 0

    def tick(self) -> None:
        """Ends a stall once its time is up (called about once a second and on each request)."""
        if self.flusher.paused and self.clock() >= self.stall_until:
            self.flusher.resume()

    def apply(self, body: bytes) -> bytes:
        try:
            spec = orjson.loads(body or b"{}")
            kind = spec["kind"]
            seconds = float(spec.get("seconds", 5.0))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise apierrors.bad_request('want {"kind": "error"|"stall", "seconds": S[, "code": N]}') from None
        until = self.clock() + seconds
        if kind == "error":
            code = int(spec.get("code", 500))
            if code not in (429, 500, 503):
                raise apierrors.bad_request("code must be 429, 500 or 503")
            self.error_code, self.error_until = code, until
        elif kind == "stall":
            self.stall_until = until
            self.flusher.pause()
        else:
            raise apierrors.bad_request(f"unknown fault {kind!r}")
        return orjson.dumps({"kind": kind, "seconds": seconds})

    def clear(self) -> None:
        self.error_code = 0
        self.stall_until = 0.0
        self.flusher.resume()

    def error_for(self, request: Request) -> apierrors.StatusError | None:
        """The injected error for an API request, if one is active."""
        self.tick()
        code = self.active_error()
        if not code or request.path.startswith(("/sim/", "/readyz", "/livez", "/healthz", "/debug/", "/metrics")):
            return None
        if code == 429:
            return apierrors.too_many_requests("injected fault: too many requests", 1)
        if code == 503:
            return apierrors.StatusError(503, "ServiceUnavailable", "injected fault: unavailable", retry_after=1)
        return apierrors.internal_error("injected fault")

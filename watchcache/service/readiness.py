"""The log says what ``/readyz`` says: ``ready`` only once it answers 200, else why not.

A process listens before it is ready (a proxy's caches sync after the port opens, as
kube-apiserver's do). Logging ``ready: listening on ...`` at that moment told an operator, and
every script that waits for that line, that a proxy whose upstream is unreachable was ready. Now:

    listening ──(ready within GRACE)──────────────────────────▶ "ready: listening on URL"
        │
        └─(GRACE passed, or the upstream already failed)─▶ "serving, not ready: REASON; listening on URL"
                                                                 │ /readyz turns 200
                                                                 ▼
                                                           "ready: listening on URL"

and, once ready, each later change of ``/readyz`` is logged once (WARNING when it is lost). The
reason is the first thing an operator must act on: the upstream's last failure (with its hint),
else the caches still syncing, else the failing check (e.g. another worker not synced).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from watchcache.server.app import ApiHandler

log = logging.getLogger("watchcache")

# A normal start is ready within this (the first LIST of each resource): no "not ready" line for it.
GRACE = 1.0


def not_ready_reason(handler: ApiHandler) -> str:
    """Why ``handler``'s ``/readyz`` fails, in one line."""
    ctx = handler.ctx
    if handler.shutting_down:
        return "shutting down"
    failures = ctx.upstream_failures
    if failures is not None and None in failures.failing:
        failure = failures.last[None]
        hint = f" ({failure.hint})" if failure.hint else ""
        return f"upstream discovery failed ({failure.reason}): {failure.message}{hint}"
    if not ctx.discovered:
        return "waiting for the upstream's discovery"
    cachers = list(ctx.cachers.items())
    unsynced = [resource for resource, cacher in cachers if not cacher.serving]
    if unsynced:
        names = ", ".join(r.qualified for r in unsynced[:5]) + (", ..." if len(unsynced) > 5 else "")
        text = f"{len(unsynced)} of {len(cachers)} caches not synced ({names})"
        failing = [r for r in unsynced if failures is not None and r in failures.failing]
        if failing and failures is not None:
            failure = failures.last[failing[0]]
            text += f"; upstream {failure.verb} of {failing[0].qualified} failed ({failure.reason}): {failure.message}"
            text += f" ({failure.hint})" if failure.hint else ""
        return text
    if not cachers and handler.worker is None:
        return "no resource to cache"
    for check in handler.readiness_checks:
        passed, line = check()
        if not passed:
            return line.removeprefix("[-]")
    return "not ready"


class ReadinessLog:
    """Logs ``who``'s readiness as ``/readyz`` would answer it: call ``check`` often (every 50 ms until
    the first verdict, then on the process's tick); each line is logged once per change."""

    def __init__(
        self,
        who: str,
        url: str,
        handler: ApiHandler,
        details: Callable[[], str] = str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.who = who
        self.url = url
        self.handler = handler
        self.details = details  # e.g. "(8 resources, 1000 objects cached, 0.41s)"
        self.clock = clock
        self.since = clock()
        # None until the first line; then whether the last line said ready.
        self.said_ready: bool | None = None

    def check(self) -> bool:
        """Log a line if readiness changed (or the grace ran out); returns whether it is ready now."""
        ready, _ = self.handler.readiness()
        if ready:
            if self.said_ready is not True:
                self.said_ready = True
                details = self.details()
                log.info("%s ready: listening on %s%s", self.who, self.url, f" {details}" if details else "")
            return True
        failing = self.handler.ctx.upstream_failures
        if self.said_ready is None and self.clock() - self.since < GRACE and not (failing and failing.failing):
            return False
        if self.said_ready is not False:
            level = logging.WARNING if self.said_ready else logging.INFO
            self.said_ready = False
            log.log(level, "%s serving, not ready: %s; listening on %s", self.who, not_ready_reason(self.handler),
                    self.url)  # fmt: skip
        return False

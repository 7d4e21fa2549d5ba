"""Health and readiness as kube-apiserver answers them: /healthz and /livez (alive), /readyz (every cache synced).

A process is ready once each of its caches has synced and its other checks pass (the process
assembly adds them: the other workers' sync); a draining one fails kube's shutdown check, so
that its load balancer stops sending it requests. ``?verbose`` lists every check of the whole
worker group (``server/status.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from watchcache.server.context import ApiContext

TEXT = "text/plain; charset=utf-8"
# The readiness check a draining process fails (kube-apiserver's shutdown check).
SHUTTING_DOWN = "[-]shutdown failed: the process is shutting down"

Check = Callable[[], tuple[bool, str]]


def readiness(
    ctx: ApiContext, *, worker: int | None, shutting_down: bool, checks: Sequence[Check]
) -> tuple[bool, list[str]]:
    """Whether this process is ready, and one ``[+]``/``[-]`` line per check."""
    lines = []
    # A worker of a group may own nothing (more workers than resources): it is ready once
    # discovery has said so and every worker has synced (the workers-synced check).
    ok = (bool(ctx.cachers) if worker is None else ctx.discovered) and not shutting_down
    if shutting_down:
        lines.append(SHUTTING_DOWN)
    for resource, cacher in list(ctx.cachers.items()):
        ok &= cacher.serving  # a suspended JSON feed is served by the protobuf cache
        state = "ok" if cacher.serving else "failed: not synced"
        lines.append(f"[{'+' if cacher.serving else '-'}]cache-synced:{resource.qualified} {state}")
    for check in checks:
        passed, line = check()
        ok &= passed
        lines.append(line)
    return ok, lines


def readyz_body(ok: bool, lines: Sequence[str] | None) -> tuple[int, bytes]:
    """/readyz's status and text: ``lines`` for ``?verbose`` (None: the short answer)."""
    if lines is None:
        text = "ok" if ok else "not ready"
    else:
        text = "\n".join([*lines, "readyz check passed" if ok else "readyz check failed"])
    return 200 if ok else 500, text.encode()

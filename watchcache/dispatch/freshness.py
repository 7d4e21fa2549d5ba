"""The waits of a read whose cache is behind what it needs (invariant 8).

A consistent LIST or watch waits for its scope's proof (``reach_scope``: one shared round trip,
``Progress.prove_scope``; docs/consistency.md). A read at a requested rv (NotOlderThan/Exact/
continue, a watch from an rv) waits for the cache to reach it (``reach``):

1. **Target.** The requested rv (``target=None``: the upstream's rv now, ``Progress.current_rv``,
   the proxy's consistent ``limit=1`` LIST started after the call; used to bring a relisted cache
   up to date).
2. **Events.** The cache reaches ``target`` by its own feed: events, the reflector's bookmarks.
3. **Proof.** Once the cache is known to be behind, the upstream proves progress meanwhile
   (``Progress.proving``: the proxy's probe watches, docs/consistency.md); a proof moves the
   cache's rv, waking every read whose target it reaches, whichever read asked for it.
4. **Give up** ``timeout`` after the read started (``--fresh-wait``; kube-apiserver: 3 s): the
   caller answers 504 "Too large resource version" (a requested rv) or passes the read
   through to the upstream (a consistent read). A stale answer is a bug; a pass-through a cost.

The timing of each phase is returned for the metrics (docs/consistency.md lists them).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from watchcache.dispatch.cacher import Cacher


class NoTarget(Exception):
    """The upstream's current rv could not be read (unreachable, failing, or backing off)."""


class Progress(Protocol):
    """What the upstream offers a cache that is behind: its current rv, and proofs of progress."""

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        """The upstream's rv, read after this call started; raises NoTarget."""

    def proving(self, cacher: Cacher) -> AbstractContextManager[asyncio.Future[None] | None]:
        """While entered, the upstream works at proving ``cacher``'s progress (bounded, shared). Its
        value, if any, is done when no proof is coming: a probe ended without a bookmark, and none
        of this resource ever ended with one."""

    def unprovable(self, cacher: Cacher) -> bool:
        """True while proofs of ``cacher``'s progress are known to end without a bookmark: the
        upstream serves the resource from its storage (kube-apiserver's events, which it does not
        cache by default), so no wait for a proof is worth making."""

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        """Whether the cache's state of ``namespace`` (None: every one) is at least the upstream's as of
        this call: PROGRESS or EVENTS if it is, IMPATIENT if not; raises NoTarget."""


class Reached(enum.Enum):
    """How a wait ended."""

    AT_ONCE = "at_once"  # the cache was there already
    EVENTS = "events"  # its own events brought it there
    PROGRESS = "progress"  # a proof of progress (probe or bookmark) did
    TIMEOUT = "timeout"  # not within the time allowed
    UNPROVEN = "unproven"  # no proof is coming (``Progress.proving``): the caller gave up on it
    IMPATIENT = "impatient"  # a scope that changed as it was proven, not caught up within its patience
    NO_TARGET = "no_target"  # the upstream's rv could not be read


@dataclass(frozen=True)
class Wait:
    how: Reached
    target: int | None
    # Seconds spent learning the target (consistent reads), then waiting for the cache to reach it.
    target_seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def reached(self) -> bool:
        return self.how in (Reached.AT_ONCE, Reached.EVENTS, Reached.PROGRESS)

    @property
    def seconds(self) -> float:
        return self.target_seconds + self.wait_seconds


async def reach_scope(cacher: Cacher, namespace: str | None, progress: Progress, timeout: float) -> Wait:
    """Wait (at most ``timeout``) until the cache's state of one scope is provably the upstream's now or newer.

    The wait of a consistent LIST or watch: one round trip whatever the rest of the cluster
    writes (``Progress.prove_scope``; docs/consistency.md), where ``reach`` would wait for the
    upstream's next bookmark when the resource is quiet and the cluster is not.
    """
    started = time.monotonic()
    try:
        how = await progress.prove_scope(cacher, namespace, timeout)
    except NoTarget:
        return Wait(Reached.NO_TARGET, None, time.monotonic() - started)
    return Wait(how, None, time.monotonic() - started)


async def reach(
    cacher: Cacher,
    target: int | None,
    progress: Progress,
    timeout: float,
    *,
    give_up_unproven: bool = False,
) -> Wait:
    """Wait (at most ``timeout``) until ``cacher`` provably holds the state at ``target``.

    ``target=None``: the upstream's state as of this call. ``give_up_unproven``: end the wait
    (``Reached.UNPROVEN``) as soon as the upstream is seen not to prove this resource, for a caller
    that then asks the upstream itself (a GET or LIST of kube's events at an rv the cache has not
    seen: kube answers it from etcd at once, where waiting out ``timeout`` would end in a 504).
    """
    if target is not None and cacher.rv >= target:
        return Wait(Reached.AT_ONCE, target)
    started = time.monotonic()
    deadline = started + timeout
    if target is None:
        try:
            target = await progress.current_rv(cacher, timeout)
        except NoTarget:
            return Wait(Reached.NO_TARGET, None, time.monotonic() - started)
    known = time.monotonic()
    if cacher.rv >= target:
        return Wait(Reached.AT_ONCE, target, known - started)
    # Proofs start once the cache is known to be behind (on a busy resource events bring it
    # there, and a probe would be wasted). A proof under way for another read counts too:
    # it is sound whenever its probe started.
    with progress.proving(cacher) as proofless:
        if give_up_unproven and proofless is not None:
            reached = await _wait_unless(cacher.wait_for_rv(target, deadline - known), proofless)
        else:
            reached = await cacher.wait_for_rv(target, deadline - known)
    done = time.monotonic()
    if reached is None:
        return Wait(Reached.UNPROVEN, target, known - started, done - known)
    newest_event = cacher.cache.history.newest_rv
    if not reached:
        how = Reached.TIMEOUT
    elif newest_event is not None and newest_event >= target:
        how = Reached.EVENTS
    else:
        how = Reached.PROGRESS
    return Wait(how, target, known - started, done - known)


async def _wait_unless(waiting: Coroutine[Any, Any, bool], unless: asyncio.Future[None]) -> bool | None:
    """``waiting``'s result, or None if ``unless`` is done first (then ``waiting`` is cancelled).
    ``unless`` is shared by other reads: it is never cancelled here."""
    task = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait((task, unless), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    return None

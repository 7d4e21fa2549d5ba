"""A JSON feed suspended while only protobuf clients read its resource: one upstream watch per encoding read.

kube-apiserver writes a watch in one encoding, and neither of a resource's caches can be derived
from the other here without the kinds' schemas (docs/architecture.md, "Full objects in
protobuf"): a resource read both in JSON and in protobuf costs two upstream watches. Issue 30
allows that only while clients of both encodings read it. A resource's protobuf cache is made on
its first protobuf read and dropped when idle (``upstream/protobuf.py``); this module is the JSON
side's counterpart. Per resource this worker owns::

    RUNNING --its protobuf cache synced, and no JSON read, watcher or follower for idle--> SUSPENDED
    SUSPENDED --a JSON read (ensure_ready), a follower's stream (shard/owner.py)--> RESUMING
    SUSPENDED --its protobuf cache gone (dropped when idle, or ended)--> RESUMING
    RESUMING --listed (Cacher.replace)--> RUNNING

A suspended JSON cache holds nothing (``Cacher.suspend``) and counts as served for readiness.
The read that resumes it waits for the resync (``resume_wait``, as a follower's first read waits
for its snapshot) instead of getting 429 at once; a watch from an rv the resumed cache no longer
has gets 410 (or is backfilled from the upstream, as after any relist). JSON reads are what
PartialObjectMetadata, Tables and JSON clients do (they are all cut from the JSON cache), and a
protobuf client's JSON fallback while its protobuf cache syncs: each keeps the JSON feed running.

What counts as read is the ``Cacher``'s own bookkeeping (``last_used``, its watchers and
replicas), so the decision (``should_suspend``) is a pure function, tested without I/O.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable

from watchcache.dispatch.cacher import Cacher, CacherState
from watchcache.resources import ResourceType
from watchcache.upstream.reflector import Reflector

log = logging.getLogger("watchcache.upstream.encodings")

# How long the read that resumes a suspended JSON cache waits for its resync before 429: a
# follower's first read waits as long for its snapshot (shard/follower.py). A resync is one LIST.
RESUME_WAIT = 5.0


def should_suspend(json: Cacher, protobuf: Cacher | None, now: float, idle: float) -> bool:
    """The JSON feed of a resource may stop: its protobuf cache serves, and nobody has read its
    JSON cache for ``idle`` seconds (no request, no watcher, no follower in another worker)."""
    return (
        protobuf is not None
        and protobuf.ready
        and json.ready
        and len(json.dispatcher) == 0
        and not json.replicas
        and now - json.last_used >= idle
    )


class JsonFeeds:
    """This worker's JSON reflectors, each one task that may be suspended and resumed (see the module doc).

    Owned by the event loop: ``tick`` (housekeeping) suspends, a read's ``Cacher.resume`` resumes.
    Invariant: a reflector's cacher is in ``tasks`` iff its feed runs (RUNNING or RESUMING).
    """

    def __init__(
        self,
        protobuf: Callable[[ResourceType], Cacher | None],
        *,
        idle: float = 300.0,
        resume_wait: float = RESUME_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The synced protobuf cache of a resource on this worker, or None (never starts one).
        self.protobuf = protobuf
        self.idle = idle
        self.resume_wait = resume_wait
        self.clock = clock
        self.reflectors: dict[Cacher, Reflector] = {}
        self.tasks: dict[Cacher, asyncio.Task[None]] = {}
        # The reflectors whose end does not end ``run``: an on-demand kind's (its cache is dropped, or
        # its CRD deleted, without stopping the process).
        self.optional: set[Cacher] = set()
        self.suspensions = 0
        self.resumptions = 0
        # Set with the exception of a reflector that ended by itself (a bug: they run until cancelled).
        self._failed: asyncio.Future[None] | None = None

    async def run(self, reflectors: Iterable[Reflector]) -> None:
        """Run every reflector until cancelled; raises what a reflector raised, once all are cancelled."""
        self._failed = asyncio.get_running_loop().create_future()
        for reflector in reflectors:
            self.add(reflector)
        try:
            await self._failed
        finally:
            self.stop()

    def add(self, reflector: Reflector, *, optional: bool = False) -> None:
        """Run one more reflector (a resource cached later: on demand, a new CRD). ``optional``: if it
        ends by itself, it is logged and forgotten, and the other feeds go on."""
        self.reflectors[reflector.cacher] = reflector
        if optional:
            self.optional.add(reflector.cacher)
        self._start(reflector)

    def remove(self, cacher: Cacher) -> None:
        """Stop and forget ``cacher``'s reflector (a resource no longer cached), suspended or not."""
        self.reflectors.pop(cacher, None)
        self.optional.discard(cacher)
        task = self.tasks.pop(cacher, None)
        if task is not None:
            task.cancel()

    def _start(self, reflector: Reflector) -> None:
        task = asyncio.ensure_future(reflector.run())
        task.add_done_callback(functools.partial(self._ended, reflector))
        self.tasks[reflector.cacher] = task

    def _ended(self, reflector: Reflector, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception() or RuntimeError(f"the reflector of {reflector.resource.qualified} returned")
        cacher = reflector.cacher
        if cacher in self.optional:
            if self.tasks.get(cacher) is task:
                log.error("JSON feed of %s ended: %r", reflector.resource.qualified, error)
                self.remove(cacher)
            return
        if self._failed is None or self._failed.done():
            return
        self._failed.set_exception(error)

    def tick(self) -> None:
        """Housekeeping: suspend the feeds only protobuf clients need; resume those whose protobuf cache went."""
        now = self.clock()
        for cacher in list(self.reflectors):
            if cacher.state is CacherState.SUSPENDED:
                if cacher.resume is not None and self.protobuf(cacher.resource) is None:
                    self._resume(cacher, "its protobuf cache is gone")
            elif cacher in self.tasks and should_suspend(cacher, self.protobuf(cacher.resource), now, self.idle):
                self._suspend(cacher)

    def _suspend(self, cacher: Cacher) -> None:
        self.tasks.pop(cacher).cancel()
        cacher.ready_wait = self.resume_wait
        cacher.suspend(functools.partial(self._resume, cacher, "a JSON client reads it"))
        self.suspensions += 1
        log.info(
            "JSON feed of %s: suspended (only protobuf clients read it for %.0fs; one upstream watch)",
            cacher.resource.qualified,
            self.idle,
        )

    def _resume(self, cacher: Cacher, why: str) -> None:
        if cacher in self.tasks or cacher.state is not CacherState.SUSPENDED or cacher not in self.reflectors:
            return
        cacher.resume = None  # once: the next reads wait for this resync
        reflector = self.reflectors[cacher]
        reflector.resync()
        self._start(reflector)
        self.resumptions += 1
        log.info("JSON feed of %s: resumed (%s)", cacher.resource.qualified, why)

    def suspended(self) -> list[ResourceType]:
        return [c.resource for c in self.reflectors if c.state is CacherState.SUSPENDED]

    def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()

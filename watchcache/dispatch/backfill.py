"""Backfill: bring a cache's window back to an older rv for the requests that need it, one fetch at a time.

A read or watch at an rv older than the window (a client resuming after the proxy, a worker
or a follow stream restarted) waits here instead of getting 410, while the cache's
``Fetch`` gets the missing span from where the history still is — the upstream (the owner:
``upstream.backfill``) or the owner worker (a follower: ``shard.follower``) — and puts it in
front of the window (``ResourceCache.backfill``, which checks it: invariant 13).

One resource, one fetch at a time, shared: requests arriving within ``coalesce`` seconds of
each other (a restart storm: clients holding slightly different rvs) are served by one fetch
from the oldest rv asked; those that arrive during a fetch with an rv it does not reach get
the next one. A fetch that fails for its rv (the upstream compacted it, a bound) fails the
requests at or below that rv at once and is tried again for the others. One that fails for
any other reason (an error, a timeout, no proof of completeness, a span that did not check)
is tried again after a backoff while requests wait, so a passing fault costs a client a
delay, not a relist; the requests waiting when ``attempts`` fetches in a row have failed get
the last failure. A source that already retried (an owner worker answering a follower: its own
``Backfills`` made its attempts) is not asked again in the same run: its failure is the last.
Every wait is bounded by its request's deadline (``--backfill-wait``), and fetches by the
backoff, so a failing upstream is asked a few times, not once per client; a fetch is not
cancelled when its requests give up (its span serves the next ones).

An upstream that cannot be asked now (``BackfillFailed.UNREACHABLE``: it was killed, restarts,
sheds load) makes its requests answer 429, so that clients come back later from the same rv
instead of relisting (``dispatch.outcomes.before_window``). That lasts ``unreachable_for`` seconds
of failing fetches in a row at most: after that the failure is ``FAILED`` and the 410 comes, so
no client is told to retry for ever. While it lasts, a request whose wait ends before the next
attempt (the backoff grows past it) is told at once, not at the end of its wait.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from watchcache.backoff import Backoff
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.outcomes import BackfillFailed  # raised here; importers of it from here keep working
from watchcache.histogram import PlainHistogram

log = logging.getLogger("watchcache.dispatch.backfill")

# Seconds between two log lines of the same failed-fetch outcome of one cache (the others at DEBUG).
REPORT_EVERY = 60.0


@dataclass(frozen=True)
class BackfillLimits:
    """How far a backfill may reach and what it may cost (the ``--backfill-*`` flags)."""

    enabled: bool = True
    # How long a request waits for a backfill before its 410 (a fetch is a paged LIST and a short
    # watch: about 1-3 s against kube-apiserver, whose bookmark comes 1-2.25 s into a watch).
    wait: float = 10.0
    # A span's events and their bytes (object JSON): a fetch that reads more is abandoned.
    max_events: int = 20_000
    max_bytes: int = 256 << 20
    # Fetches from the upstream at once per worker, and the bytes they may hold together
    # (the LIST at the old rv counts: it is held until the span is checked). After a restart every
    # resource whose clients come back needs one: a worker owning a dozen must not queue them
    # past the requests' wait.
    concurrency: int = 4
    memory_bytes: int = 512 << 20
    # Requests arriving within this many seconds of the first share its fetch.
    coalesce: float = 0.1
    # A fetch gives up after this long, whoever waits for it.
    fetch_timeout: float = 30.0
    # Seconds an unreachable upstream answers its requests 429 (retry) before 410 (relist): a
    # client-go reflector backs off up to 30 s between retries, so a few of them.
    unreachable_for: float = 60.0

    def check(self) -> None:
        if self.wait <= 0 or self.fetch_timeout <= 0:
            raise ValueError("--backfill-wait must be positive")
        if self.unreachable_for < 0:
            raise ValueError("--backfill-unreachable-for must not be negative")
        if min(self.max_events, self.max_bytes, self.concurrency, self.memory_bytes) < 1:
            raise ValueError("--backfill-max-events, -max-bytes, -concurrency and -memory-bytes must be at least 1")


@dataclass(frozen=True)
class Fetched:
    """What a fetch brought: events put in front of the window, and bytes read to get them."""

    events: int
    bytes: int


# Fetch(cacher, rv): bring cacher's window back to rv (a span from rv, ``Cacher.backfill``); raises BackfillFailed.
Fetch = Callable[[Cacher, int], Awaitable[Fetched]]


class Durations(PlainHistogram):
    """How long fetches took (observed once per fetch): from a fast owner's 0.1 s to a slow upstream's 30 s."""

    BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)

    __slots__ = ()


class Backfills:
    """One cache's backfills (see the module doc)."""

    def __init__(
        self,
        cacher: Cacher,
        fetch: Fetch,
        *,
        wait: float = 10.0,
        coalesce: float = 0.1,
        source: str = "the upstream",
        attempts: int = 3,
        backoff: Backoff | None = None,
        unreachable_for: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cacher = cacher
        self.fetch = fetch
        self.wait = wait
        self.coalesce = coalesce
        # Where the fetches go, for the logs: "the upstream", "the owner (worker 1)".
        self.source = source
        self.attempts = attempts
        self.backoff = backoff or Backoff(0.5, 10.0)
        self.unreachable_for = unreachable_for
        # Times the unreachable streak (tests move it; the backoff and waits run on the loop's time).
        self.clock = clock
        # (first, last, the last's error) of the fetches that found the source unreachable, in a row.
        self._unreachable: tuple[float, float, BackfillFailed] | None = None
        # (rv, deadline on time.monotonic, its future) of the requests waiting.
        self._waiters: list[tuple[int, float, asyncio.Future[None]]] = []
        self._pump: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        # Requests that needed a backfill, by outcome ("served" or a BackfillFailed outcome).
        self.requests: collections.Counter[str] = collections.Counter()
        # Fetches by outcome ("ok" or a BackfillFailed outcome), what they brought, how long they took.
        self.fetches: collections.Counter[str] = collections.Counter()
        self.events_fetched = 0
        self.bytes_fetched = 0
        self.durations = Durations()
        # By outcome: when a failed fetch was last logged at its level, and how many since at DEBUG.
        self._reported: dict[str, tuple[float | None, int]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def reach(self, rv: int, timeout: float) -> None:
        """Return once the window reaches back to ``rv`` (``rv >= oldest_rv``); raise BackfillFailed otherwise."""
        cache = self.cacher.cache
        if rv >= cache.oldest_rv:
            return
        if rv < cache.relisted_at:
            self.requests[BackfillFailed.RELIST] += 1
            raise BackfillFailed(
                BackfillFailed.RELIST,
                f"this cache relisted at {cache.relisted_at}: older resourceVersions cannot be served exactly",
            )
        unreachable = self._unreachable_now()
        if unreachable is not None and self._retry_at > time.monotonic() + timeout:
            # The source is down and will not be asked again before this request's wait ends: say so now.
            self.requests[unreachable.outcome] += 1
            raise BackfillFailed(unreachable.outcome, self._too_late(unreachable))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (rv, time.monotonic() + timeout, fut)
        self._waiters.append(entry)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._run())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(fut)
        except TimeoutError:
            # Waiting out the backoff of fetches that found the source unreachable is that, not a slow fetch.
            unreachable = self._unreachable_now()
            outcome = BackfillFailed.DEADLINE if unreachable is None else BackfillFailed.UNREACHABLE
            self.requests[outcome] += 1
            message = f"the history before {cache.oldest_rv} was not fetched within {timeout:g}s"
            raise BackfillFailed(outcome, message if unreachable is None else f"{message}: {unreachable}") from None
        except BackfillFailed as e:
            self.requests[e.outcome] += 1
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        self.requests["served"] += 1

    async def reach_back(self, rv: int, timeout: float | None = None) -> BackfillFailed | None:
        """``reach``, returning why it failed instead of raising (None: the window reaches ``rv``)."""
        try:
            await self.reach(rv, self.wait if timeout is None else timeout)
        except BackfillFailed as e:
            return e
        return None

    def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        # The cache stops (the proxy shuts down, or it is dropped): its history is still upstream, so
        # 429 (retry from the same rv, on the next process or cache), not 410.
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(BackfillFailed(BackfillFailed.UNREACHABLE, "the cache stopped (shutting down)"))
                fut.exception()  # retrieved: its request may be gone

    async def _run(self) -> None:
        failures = 0
        # After a failed fetch, the next one waits out the backoff, whoever asks.
        await asyncio.sleep(max(self.coalesce, self._retry_at - time.monotonic()))
        while True:
            self._settle(None)
            pending = [rv for rv, _, fut in self._waiters if not fut.done()]
            if not pending:
                return
            rv = min(pending)
            started = time.monotonic()
            try:
                fetched = await self.fetch(self.cacher, rv)
            except BackfillFailed as failed:
                self.durations.observe(time.monotonic() - started)
                self.fetches[failed.outcome] += 1
                self._report(rv, failed, time.monotonic() - started)
                told = self._passing(failed)  # what the requests get
                failures += 1
                if failures >= self.attempts or (failed.retried and told.outcome not in BackfillFailed.PER_RV):
                    self._settle(told)  # those waiting now get it; later requests start over
                    if told.outcome not in BackfillFailed.PER_RV:
                        self._retry_at = time.monotonic() + self.backoff.next()
                    return
                if told.outcome in BackfillFailed.PER_RV:
                    self._settle(told, upto=rv)  # the others may still be served: at once
                    continue
                delay = self.backoff.next()
                self._retry_at = time.monotonic() + delay
                if told.outcome in BackfillFailed.RETRY:
                    self._tell_early(told)
                await asyncio.sleep(delay)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never leave requests waiting on a pump that died
                self.durations.observe(time.monotonic() - started)
                log.exception("backfill of %s from rv %d raised", self.cacher.resource.qualified, rv)
                self.fetches[BackfillFailed.FAILED] += 1
                self._settle(BackfillFailed(BackfillFailed.FAILED, f"{type(e).__name__}: {e}"))
                return
            seconds = time.monotonic() - started
            self.durations.observe(seconds)
            self.events_fetched += fetched.events
            self.bytes_fetched += fetched.bytes
            if self.cacher.cache.oldest_rv > rv:  # a fetch that returns must have reached rv
                error = BackfillFailed(BackfillFailed.FAILED, f"the fetch from {rv} did not reach it")
                self.fetches[error.outcome] += 1
                self._settle(error, upto=rv)
                return
            self.fetches["ok"] += 1
            log.info(
                "backfilled %s from rv %d from %s: %d events, %d bytes read, %.2fs, %d requests waiting",
                self.cacher.resource.qualified,
                rv,
                self.source,
                fetched.events,
                fetched.bytes,
                seconds,
                len(self._waiters),
            )
            failures = 0
            self.backoff.reset()
            self._retry_at = 0.0
            self._unreachable = None

    def _passing(self, failed: BackfillFailed) -> BackfillFailed:
        """``failed`` as its requests get it: an unreachable source stops passing after ``unreachable_for``.

        The clock runs over failures in a row; a gap longer than ``unreachable_for`` between two (no
        fetch was needed meanwhile, the source may have been back) starts it again.
        """
        if failed.outcome not in BackfillFailed.RETRY:
            self._unreachable = None
            return failed
        now = self.clock()
        first = now
        if self._unreachable is not None and now - self._unreachable[1] <= self.unreachable_for:
            first = self._unreachable[0]
        self._unreachable = (first, now, failed)
        if now - first < self.unreachable_for:
            return failed
        return BackfillFailed(BackfillFailed.FAILED, f"{failed} (for {now - first:.0f}s)")

    def _too_late(self, failed: BackfillFailed) -> str:
        """The message of a request told before its wait ends that it would end before the next fetch."""
        after = max(0.0, self._retry_at - time.monotonic())
        return (
            f"the history before {self.cacher.cache.oldest_rv} cannot be fetched before this request's wait"
            f" ends (the next attempt is in {after:.1f}s): {failed}"
        )

    def _tell_early(self, failed: BackfillFailed) -> None:
        """Fail now, with ``failed``, the waiters whose wait ends before the next fetch (``_retry_at``)."""
        for _, deadline, fut in self._waiters:
            if not fut.done() and deadline < self._retry_at:
                fut.set_exception(BackfillFailed(failed.outcome, self._too_late(failed)))
                fut.exception()

    def _unreachable_now(self) -> BackfillFailed | None:
        """The last fetch's failure if the source has been unreachable for less than ``unreachable_for``."""
        if self._unreachable is None:
            return None
        first, last, failed = self._unreachable
        now = self.clock()
        return failed if now - first < self.unreachable_for and now - last <= self.unreachable_for else None

    def _report(self, rv: int, failed: BackfillFailed, seconds: float) -> None:
        """Log a failed fetch at the level its cause deserves, once per cause and minute.

        An rv the upstream compacted, or one past a bound (``PER_RV``), is a client's ordinary path
        after a long disconnection (it gets 410 and relists, as from kube-apiserver): INFO. Anything
        else (the upstream or the owner could not be asked, a span that did not check) is a fault:
        WARNING. A storm of clients holding old rvs is one cause: after the first line, the same
        outcome is logged at DEBUG for a minute, and the next line says how many there were.
        """
        now = time.monotonic()
        last, quiet = self._reported.get(failed.outcome, (None, 0))
        if last is not None and now - last < REPORT_EVERY:
            self._reported[failed.outcome] = (last, quiet + 1)
            level = logging.DEBUG
        else:
            self._reported[failed.outcome] = (now, 0)
            level = logging.INFO if failed.outcome in BackfillFailed.PER_RV else logging.WARNING
        log.log(
            level,
            "backfill of %s from rv %d from %s failed after %.2fs (%s): %s%s",
            self.cacher.resource.qualified,
            rv,
            self.source,
            seconds,
            failed.outcome,
            failed,
            f" ({quiet} more since the last report)" if quiet and level != logging.DEBUG else "",
        )

    def _settle(self, error: BackfillFailed | None, upto: int | None = None) -> None:
        """Wake the waiters the window now reaches; with ``error``, fail those at or below ``upto`` (None: all)."""
        oldest = self.cacher.cache.oldest_rv
        for rv, _, fut in self._waiters:
            if fut.done():
                continue
            if rv >= oldest:
                fut.set_result(None)
            elif error is not None and (upto is None or rv <= upto):
                fut.set_exception(error)
                fut.exception()  # retrieved: its request may have given up already


async def reach_back(cacher: Cacher, rv: int, timeout: float | None = None) -> BackfillFailed | None:
    """The seam the read and watch paths call: None once the window reaches ``rv``, else why not.

    ``timeout``: how long to wait (default: the cache's ``--backfill-wait``).
    """
    backfills = cacher.backfills
    if rv >= cacher.cache.oldest_rv:
        return None
    if backfills is None:
        return BackfillFailed(BackfillFailed.OFF, "")
    return await backfills.reach_back(rv, timeout)

"""One worker's flow control: its configuration, its priority levels' queue sets, the waiters.

``FlowControl.admit`` is the whole life of a request here: classified (``classify``), it is
offered to its level's queue set and, unless dispatched at once, waits on a future until a seat
is its, its queue is found full, or its wait budget runs out (kube's ``time-out``). An exempt
level has no seats: its requests execute at once. The returned ``Grant`` gives the seat back
when the request ends (``release``), or as soon as it waits for something else (``vacate``:
``server/seats.py``), as a watch's once its initial events are sent.

Seats per level are kube's nominal concurrency limits: ``ceil(server * shares / sum of all
levels' shares)``, ``server`` being ``--max-requests-inflight`` (per worker; kube adds
--max-mutating-requests-inflight, which the proxy has not), at least one for a limited level. A
level's current limit moves between its guaranteed and its most seats (``borrowing.py``): set
from every level's seat demand at each configuration and every 10 s (``rebalance``, on a loop
timer that the first request arms), the queue sets' limits follow at once. A configuration change
applies at once: a level whose queue shape changed gets a new queue set, and the old one serves
the requests it already holds until they end.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from watchcache.fairness import defaults
from watchcache.fairness.borrowing import PERIOD, LevelSeats, SeatDemand, level_bounds, reallocate
from watchcache.fairness.classify import Classification, Classifier, RequestDigest
from watchcache.fairness.config import FlowSchema, PriorityLevel, parse_flow_schema, parse_priority_level
from watchcache.fairness.dropped import DroppedRequests
from watchcache.fairness.queueset import EXECUTING, Entry, QueueSet
from watchcache.fairness.shuffle import flow_hash
from watchcache.fairness.width import ObjectStats, level_max_seats

__all__ = ["SEATS_BUCKETS", "WAIT_BUCKETS", "FlowControl", "FlowStats", "Grant", "Level", "Rejected"]

#: kube's buckets of apiserver_flowcontrol_request_wait_duration_seconds.
WAIT_BUCKETS = (0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0)
#: kube's buckets of apiserver_flowcontrol_work_estimated_seats.
SEATS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 100)


class Rejected(Exception):
    """The request may not execute: ``reason`` as kube's metric (queue-full, concurrency-limit, time-out)."""

    def __init__(self, classification: Classification, reason: str) -> None:
        super().__init__(reason)
        self.classification = classification
        self.reason = reason


@dataclass
class FlowStats:
    """Counters of one (priority level, flow schema), read at scrape time."""

    inqueue: int = 0
    executing: int = 0
    seats: int = 0  # seats the executing requests occupy (their work estimates)
    at_upstream: int = 0  # pass-throughs at the upstream on one of their flow's turns
    in_line: int = 0  # pass-throughs waiting for one (``Grant.upstream_turn``)
    dispatched: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    # execute "true"/"false" -> (bucket counts, sum): the wait of dispatched and of rejected requests.
    waits: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    # The work estimates (seats) of the requests classified here: bucket counts, sum.
    estimates: list[int] = field(default_factory=lambda: [0] * (len(SEATS_BUCKETS) + 1))
    estimated: int = 0

    def observe_estimate(self, seats: int) -> None:
        self.estimates[bisect.bisect_left(SEATS_BUCKETS, seats)] += 1
        self.estimated += seats

    def observe_wait(self, executed: bool, seconds: float) -> None:
        key = "true" if executed else "false"
        counts, total = self.waits.setdefault(key, ([0] * (len(WAIT_BUCKETS) + 1), [0.0]))
        counts[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
        total[0] += seconds


class Level:
    """A priority level as configured now: its queue set (None when exempt), its seats (nominal,
    bounds, current limit: ``borrowing.LevelSeats``), its seat demand, and the widest request it
    takes (kube's max seats: ``width.level_max_seats``)."""

    __slots__ = ("config", "demand", "held", "max_seats", "queueset", "seats")

    def __init__(self, config: PriorityLevel, seats: LevelSeats, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.seats = seats
        self.demand = SeatDemand(clock())
        self.held = 0  # an exempt level's seats in use (its requests never wait)
        self.max_seats = 0
        self.queueset = None if config.exempt else QueueSet(seats.current, *config.shape, clock=clock)
        if self.queueset is not None:
            demand = self.demand
            self.queueset.demand_changed = lambda x: demand.set(clock(), x)

    def hold(self, seats: int, now: float) -> None:
        """An exempt level's request starts (``seats`` > 0) or ends: its demand, for borrowing."""
        self.held += seats
        self.demand.set(now, self.held)


class Grant:
    """A dispatched request's seat (none for an exempt level)."""

    __slots__ = (
        "_control", "_level", "_queueset", "_released", "_turn", "classification", "entry", "flow", "seats",
        "stats",
    )  # fmt: skip

    def __init__(
        self,
        control: FlowControl,
        classification: Classification,
        queueset: QueueSet | None,
        entry: Entry | None,
        stats: FlowStats,
        seats: int = 1,
        level: Level | None = None,
        flow: int = 0,
    ) -> None:
        self._control = control
        self._queueset = queueset
        self._level = level  # exempt: its demand
        self.classification = classification
        self.entry = entry
        self.stats = stats
        self.flow = flow  # its flow's hash (flow schema and distinguisher), as the queues shard by
        self._released = False
        self._turn = False  # holds one of its flow's upstream turns (``upstream_turn``)
        self.seats = seats if entry is None else entry.seats
        stats.executing += 1
        stats.seats += self.seats
        if level is not None:
            level.hold(self.seats, control.clock())

    def release(self) -> None:
        """The request ended (a watch: its initial events were sent); idempotent."""
        if self._released:
            return
        self._released = True
        self.stats.executing -= 1
        self.stats.seats -= self.seats
        if self._level is not None:
            self._level.hold(-self.seats, self._control.clock())
        if self.entry is not None and self._queueset is not None:
            self._control.wake(self._queueset.finish(self.entry))

    def vacate(self) -> None:
        """The request waits (a review, a proof, the upstream): its seat goes back for good, as a
        watch's once its initial events are sent. Were it taken again after the wait without
        queueing (the request was admitted once), a flood's vacated requests, all back at work at
        once, would keep the level over its limit and every newcomer, a quiet flow's included,
        queued behind them: fairness only orders the queue."""
        self.release()

    async def upstream_turn(self, wait: float | None) -> None:
        """Before a pass-through goes to the upstream: its flow's turn, of as many as its level has
        seats (its current limit), waited for at most ``wait`` s (then ``Rejected``, kube's time-out),
        without a seat; ``end_upstream_turn`` when the upstream has answered.

        A pass-through's answer is relayed by this worker, so without a bound one flow's flood of them
        had every answer of its own in the worker's event loop at once, ahead of a quiet flow's (issue
        31: the quiet flow's p99 1.5x kube-apiserver's). kube-apiserver has at most its level's seats
        of a level's requests waiting on etcd, each holding its seat; here the flow's extra requests
        wait in their flow's line instead, holding nothing another flow could use (a flow of a few
        requests, a kubelet's, never waits in it). First come, first served within the flow."""
        if self.take_upstream_turn():
            return
        control = self._control
        flow = self.flow
        line = control.upstream_line.get(flow)
        if line is None:
            line = control.upstream_line[flow] = collections.deque()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(future)
        started = control.clock()
        self.stats.in_line += 1
        try:
            async with asyncio.timeout(wait):
                await future
        except TimeoutError:
            if not future.done() or future.cancelled():
                control.leave_line(flow, future)
                control.count_rejected(self.stats, "time-out", control.clock() - started)
                control.dropped.record(self.classification.priority_level.name, control.clock())
                raise Rejected(self.classification, "time-out") from None
            # Handed the turn just as the wait ended: it is this request's.
        except BaseException:
            if future.done() and not future.cancelled():  # handed the turn, gone: the next one's
                self._took_turn()
                self.end_upstream_turn()
            else:
                control.leave_line(flow, future)
            raise
        finally:
            self.stats.in_line -= 1
        self._took_turn()

    def take_upstream_turn(self) -> bool:
        """``upstream_turn`` without waiting: False if the request must wait in its flow's line."""
        queueset = self._queueset
        if queueset is None or self._turn:  # exempt: its requests never wait
            return True
        control = self._control
        turns = control.upstream_turns.get(self.flow, 0)
        if turns < max(1, queueset.limit) and self.flow not in control.upstream_line:  # (a level lent all: one)
            control.upstream_turns[self.flow] = turns + 1
            self._took_turn()
            return True
        return False

    def _took_turn(self) -> None:
        self._turn = True
        self.stats.at_upstream += 1

    def end_upstream_turn(self) -> None:
        """The upstream answered (or the pass-through failed): the turn goes to the flow's next in line."""
        if not self._turn:
            return
        self._turn = False
        self.stats.at_upstream -= 1
        queueset = self._queueset
        assert queueset is not None
        control = self._control
        flow = self.flow
        turns = control.upstream_turns[flow] - 1
        line = control.upstream_line.get(flow)
        while line and turns < max(1, queueset.limit):
            future = line.popleft()
            if not future.done():
                future.set_result(None)
                turns += 1
        if not line:
            control.upstream_line.pop(flow, None)
        if turns:
            control.upstream_turns[flow] = turns
        else:
            del control.upstream_turns[flow]


class FlowControl:
    """Classify and admit the requests of one worker, with ``server_limit`` seats shared by the levels;
    configured with kube's suggested objects until ``configure`` is given others."""

    def __init__(self, server_limit: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.server_limit = server_limit
        self.clock = clock
        self.classifier = Classifier((), ())
        self.levels: dict[str, Level] = {}
        self.stats: dict[tuple[str, str], FlowStats] = {}
        # Where the configuration came from, for /readyz?verbose.
        self.source = "kube's suggested defaults (none read from an upstream)"
        # Objects skipped (by kind) because they could not be followed: counted by their source.
        self.skipped: dict[str, int] = {}
        # Refusals per level: the Retry-After of the next 429 (kube's droppedRequestsTracker).
        self.dropped = DroppedRequests()
        # Per flow: its pass-throughs at the upstream, and those waiting for their turn
        # (``Grant.upstream_turn``).
        self.upstream_turns: dict[int, int] = {}
        self.upstream_line: dict[int, collections.deque[asyncio.Future[None]]] = {}
        # The objects stored of a (group, version, resource), for a LIST's work estimate: the
        # cache's, where one is (set by the handler); None: not known here (one seat).
        self.object_stats: Callable[[str, str, str], ObjectStats | None] = lambda group, version, resource: None
        # Borrowing: the sum of the levels' nominal seats (what is shared), kube's seat_fair_frac,
        # and the timer of the next adjustment (armed by the first request).
        self.nominal_sum = 0
        self.fair_frac = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.configure(
            [parse_flow_schema(o) for o in defaults.flow_schemas()],
            [parse_priority_level(o) for o in defaults.priority_levels()],
        )

    def configure(self, schemas: Iterable[FlowSchema], levels: Iterable[PriorityLevel], source: str = "") -> None:
        """Apply a configuration (the mandatory objects added where missing); live, as kube's controller."""
        classifier = Classifier(schemas, levels)
        shares = sum(level.nominal_concurrency_shares for level in classifier.levels.values()) or 1
        new: dict[str, Level] = {}
        for name, config in classifier.levels.items():
            nominal = math.ceil(self.server_limit * config.nominal_concurrency_shares / shares)
            if not config.exempt:
                nominal = max(1, nominal)
            lower, upper = level_bounds(
                nominal, config.lendable_percent, config.borrowing_limit_percent, self.server_limit
            )
            old = self.levels.get(name)
            if old is not None and old.config.exempt == config.exempt:
                seats = old.seats  # kube keeps a level's current limit and demand statistics
                seats.nominal, seats.lower, seats.upper = nominal, lower, upper
            else:
                seats = LevelSeats.initial(config.exempt, nominal, lower, upper)
            if old is not None and old.config.exempt == config.exempt and old.config.shape == config.shape:
                old.config = config
                new[name] = old
            else:
                new[name] = Level(config, seats, self.clock)
            new[name].max_seats = level_max_seats(nominal, config.hand_size) if config.queues else 0
        self.levels = new
        self.nominal_sum = sum(level.seats.nominal for level in new.values())
        self.classifier = classifier
        if source:
            self.source = source
        self.rebalance()

    def rebalance(self) -> None:
        """kube's seat borrowing (every 10 s, and at each configuration): each level's current limit
        from the levels' seat demand since the last time; the queue sets follow at once."""
        now = self.clock()
        observed = {name: level.demand.reset(now) for name, level in self.levels.items()}
        self.fair_frac = reallocate({n: level.seats for n, level in self.levels.items()}, observed, self.nominal_sum)
        for level in self.levels.values():
            if level.queueset is not None:
                self.wake(level.queueset.set_limit(level.seats.current))

    def _arm(self) -> None:
        """The 10 s timer of ``rebalance`` (kube's ``wait.Until(updateBorrowing, 10s)``), from the first request."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(PERIOD, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.rebalance()
        self._arm()

    def stop(self) -> None:
        """Cancel the timer (a worker's shutdown; tests)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def classify(self, digest: RequestDigest) -> Classification:
        return self.classifier.classify(digest)

    def max_seats(self, level: str) -> int:
        """The widest request ``level`` takes (0: no maximum of its own)."""
        found = self.levels.get(level)
        return 0 if found is None else found.max_seats

    def stats_for(self, c: Classification) -> FlowStats:
        key = (c.priority_level.name, c.flow_schema.name)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = FlowStats()
        return stats

    async def admit(self, c: Classification, wait: float | None, seats: int = 1) -> Grant:
        """``seats`` (its work estimate) for a classified request, after waiting at most ``wait`` seconds;
        raises ``Rejected``."""
        if self._timer is None:
            self._arm()
        stats = self.stats_for(c)
        stats.observe_estimate(seats)
        level = self.levels.get(c.priority_level.name)
        queueset = None if level is None else level.queueset
        if queueset is None:  # exempt (or a level gone since classification: not worth a 429)
            stats.dispatched += 1
            return Grant(self, c, None, None, stats, seats, level)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        flow = flow_hash(c.flow_schema.name, c.distinguisher)
        entry = queueset.offer(flow, future, seats)
        if entry.state == EXECUTING:
            stats.dispatched += 1
            stats.observe_wait(True, 0.0)
            return Grant(self, c, queueset, entry, stats, flow=flow)
        if entry.reason:  # rejected at once
            self.count_rejected(stats, entry.reason, 0.0)
            self.dropped.record(c.priority_level.name, self.clock())
            raise Rejected(c, entry.reason)
        started = self.clock()
        stats.inqueue += 1
        try:
            async with asyncio.timeout(wait):
                await future
        except TimeoutError:
            if queueset.cancel(entry, "time-out"):
                self.count_rejected(stats, "time-out", self.clock() - started)
                self.dropped.record(c.priority_level.name, self.clock())
                raise Rejected(c, "time-out") from None
            # Dispatched just as the wait ended: the seat is this request's.
        except BaseException:
            # Cancelled (the client went, the request's deadline): out of the queue, or the seat back.
            if not queueset.cancel(entry, "cancelled"):
                self.wake(queueset.finish(entry))
            else:
                self.count_rejected(stats, "cancelled", self.clock() - started)
            raise
        finally:
            stats.inqueue -= 1
        stats.dispatched += 1
        stats.observe_wait(True, self.clock() - started)
        return Grant(self, c, queueset, entry, stats, flow=flow)

    def leave_line(self, flow: int, future: asyncio.Future[None]) -> None:
        """A request waiting for its flow's upstream turn went (its wait's end, cancelled)."""
        line = self.upstream_line.get(flow)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.remove(future)
            if not line:
                del self.upstream_line[flow]

    def retry_after(self, c: Classification) -> int:
        """The Retry-After of a 429 for ``c``'s level, in seconds (1 to 32)."""
        return self.dropped.retry_after(c.priority_level.name)

    def count_rejected(self, stats: FlowStats, reason: str, waited: float) -> None:
        stats.rejected[reason] = stats.rejected.get(reason, 0) + 1
        stats.observe_wait(False, waited)

    @staticmethod
    def wake(entries: list[Entry]) -> None:
        """Resolve the futures of requests just dispatched."""
        for entry in entries:
            future = entry.payload
            if not future.done():
                future.set_result(None)

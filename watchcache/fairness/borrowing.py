"""Borrowing between priority levels: kube's periodic re-allocation of the server's seats; free of I/O.

Each level has nominal seats (its share of the server's), of which ``lendablePercent`` may be lent
(its guaranteed seats, ``lower``, are the rest) and up to ``borrowingLimitPercent`` more borrowed
(``upper``; no limit: the server's seats). Every 10 s (kube's ``borrowingAdjustmentPeriod``) each
level's seat demand (seats in use plus seats waiting, integrated over time by ``SeatDemand``, kube's
``seatDemandIntegrator``) gives its statistics: the high watermark, the time-weighted average and
standard deviation, and a smoothed envelope ``max(avg + stddev, 0.977 × smoothed + 0.023 ×
(avg + stddev))`` (half-life 5 min). Then (kube's ``updateBorrowingLocked``) exempt levels take
what they used, and the others share the rest, the sum of all nominal seats, in proportion to
their smoothed demand (``fair_alloc``, kube's ``computeConcurrencyAllocation``), each kept within
[max(lower, min(nominal, high watermark)), upper]. So an idle level lends its lendable seats to a
busy one, which gives them back when the lender's demand returns, within a period or two.

Numbers are Go's: ``math.Round`` rounds halves away from zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PERIOD",
    "AllocItem",
    "DemandStats",
    "LevelSeats",
    "Observation",
    "SeatDemand",
    "fair_alloc",
    "go_round",
    "level_bounds",
    "reallocate",
]

#: kube's ``borrowingAdjustmentPeriod``, seconds.
PERIOD = 10.0
#: kube's ``seatDemandSmoothingCoefficient``.
SMOOTHING = 0.977
#: kube's ``MinTarget`` and ``epsilon`` of conc_alloc.go.
MIN_TARGET = 0.001
EPSILON = 1e-7


def go_round(x: float) -> int:
    """Go's ``math.Round``: halves away from zero."""
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


@dataclass(frozen=True, slots=True)
class Observation:
    """kube's ``IntegratorResults`` over a period."""

    duration: float
    average: float
    deviation: float
    max: float


class SeatDemand:
    """kube's integrator of a level's seat demand: the integrals of x and x² over time, and x's maximum;
    ``now`` comes from the caller's clock."""

    __slots__ = ("_elapsed", "_ix", "_ixx", "_last", "_max", "x")

    def __init__(self, now: float) -> None:
        self.x = 0.0
        self._last = now
        self._elapsed = self._ix = self._ixx = 0.0
        self._max = 0.0

    def _advance(self, now: float) -> None:
        dt = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._elapsed += dt
        self._ix += self.x * dt
        self._ixx += self.x * self.x * dt

    def set(self, now: float, x: float) -> None:
        self._advance(now)
        self.x = x
        self._max = max(self._max, x)

    def reset(self, now: float) -> Observation:
        """The period's results; the next period starts now, at the current value."""
        self._advance(now)
        elapsed = self._elapsed
        if elapsed > 0:
            average = self._ix / elapsed
            variance = self._ixx / elapsed - average * average
            deviation = math.sqrt(variance) if variance >= 0 else math.nan
        else:
            average = deviation = math.nan
        out = Observation(elapsed, average, deviation, self._max)
        self._elapsed = self._ix = self._ixx = 0.0
        self._max = self.x
        return out


@dataclass(slots=True)
class DemandStats:
    """kube's ``seatDemandStats``, updated once a period."""

    average: float = 0.0
    deviation: float = 0.0
    high_watermark: int = 0
    smoothed: float = 0.0

    def update(self, obs: Observation) -> None:
        self.high_watermark = go_round(obs.max)
        if obs.duration <= 0:
            return
        deviation = 0.0 if math.isnan(obs.deviation) else obs.deviation
        self.average, self.deviation = obs.average, deviation
        envelope = obs.average + deviation
        self.smoothed = max(envelope, SMOOTHING * self.smoothed + (1 - SMOOTHING) * envelope)


def level_bounds(
    nominal: int, lendable_percent: int, borrowing_limit_percent: int | None, server_limit: int
) -> tuple[int, int]:
    """(lower, upper): the guaranteed seats, nominal − round(nominal × lendable%), and the most it may
    hold, nominal + round(nominal × borrowingLimit%) (no limit: + the server's seats), as kube.

    One difference: a level that does not lend all its seats keeps at least one. At kube's 600
    seats no suggested level rounds to none; at a worker's few (8: global-default 1 nominal, 50%
    lendable; workload-low 4, 90%) two would, and a level of no seats dispatches nothing until the
    next adjustment, up to 10 s later (kube's queue set dispatches while seats in use < limit)."""
    lendable = go_round(nominal * lendable_percent / 100)
    borrowing = server_limit if borrowing_limit_percent is None else go_round(nominal * borrowing_limit_percent / 100)
    lower = nominal - lendable
    if lower < 1 and lendable_percent < 100 and nominal >= 1:
        lower = 1
    return lower, nominal + borrowing


@dataclass(slots=True)
class LevelSeats:
    """One level's seats for the allocation: configured (``nominal``, ``lower``, ``upper``), then its
    ``current`` limit and the ``target`` it was given, from its demand statistics."""

    exempt: bool
    nominal: int
    lower: int
    upper: int
    current: int
    stats: DemandStats
    target: float = 0.0

    @classmethod
    def initial(cls, exempt: bool, nominal: int, lower: int, upper: int) -> LevelSeats:
        """A new level's limit before its first allocation: nominal − lendable / 2, as kube."""
        return cls(exempt, nominal, lower, upper, nominal - (nominal - lower) // 2, DemandStats())


@dataclass(frozen=True, slots=True)
class AllocItem:
    """kube's ``allocProblemItem``."""

    lower: float
    upper: float
    target: float


def fair_alloc(required: int, items: Sequence[AllocItem]) -> tuple[list[float], float]:
    """kube's ``computeConcurrencyAllocation``: allocations summing to ``required``, each within its
    bounds, and otherwise ``fair_prop × target`` for one ``fair_prop``; ``ValueError`` if impossible."""
    if required < 0:
        raise ValueError("negative sums are not supported")
    low_sum = high_sum = target_sum = 0.0
    lb_min = ub_min = math.inf
    lb_max = ub_max = -math.inf
    relative: list[tuple[float, float, float]] = []  # (target, lower / target, upper / target)
    for n, item in enumerate(items):
        if item.lower < 0:
            raise ValueError(f"lower bound {n} is {item.lower} but negative lower bounds are not allowed")
        if item.target < item.lower:
            raise ValueError(f"target {n} is {item.target}, which is below its lower bound of {item.lower}")
        if item.upper < item.lower:
            raise ValueError(
                f"upper bound {n} is {item.upper} but should not be less than the lower bound {item.lower}"
            )
        target = max(item.target, MIN_TARGET)
        low_sum += item.lower
        high_sum += item.upper
        target_sum += target
        rel = (target, item.lower / target, item.upper / target)
        lb_min, lb_max = min(lb_min, rel[1]), max(lb_max, rel[1])
        ub_min, ub_max = min(ub_min, rel[2]), max(ub_max, rel[2])
        relative.append(rel)
    if low_sum - required > EPSILON:
        raise ValueError(f"lower bounds sum to {low_sum}, which is higher than the required sum of {required}")
    if required - high_sum > EPSILON:
        raise ValueError(f"upper bounds sum to {high_sum}, which is lower than the required sum of {required}")
    if required == 0:
        return [0.0] * len(items), 0.0
    if low_sum - required > -EPSILON:  # no wiggle room, constrained from below
        return [item.lower for item in items], lb_min
    if required - high_sum > -EPSILON:  # no wiggle room, constrained from above
        return [item.upper for item in items], ub_max
    fair_prop = required / target_sum
    if lb_max <= fair_prop <= ub_min:  # no bound matters
        return [rel[0] * fair_prop for rel in relative], fair_prop
    # Some bounds matter: raise fair_prop past the sorted relative bounds until the sum is reached.
    bounds = sorted((b, n, lower) for n, rel in enumerate(relative) for b, lower in ((rel[1], True), (rel[2], False)))
    sum_so_far, fair_prop = low_sum, lb_min
    sensitive_sum, delta_sum = 0.0, 0.0
    sensitive, delta = 0, 0
    index = 0
    while sum_so_far < required:
        while True:
            sensitive_sum += delta_sum
            sensitive += delta
            if index >= len(bounds):
                raise ValueError("impossible: ran out of bounds to consider in bound-constrained problem")
            next_bound, n, lower = bounds[index]
            delta, delta_sum = (1, relative[n][0]) if lower else (-1, -relative[n][0])
            index += 1
            if next_bound > fair_prop:
                break
        if sensitive == 0:
            fair_prop = next_bound
            continue
        next_prop = fair_prop + (required - sum_so_far) / sensitive_sum
        if next_prop <= next_bound:
            fair_prop = next_prop
            break
        sum_so_far += (next_bound - fair_prop) * sensitive_sum
        fair_prop = next_bound
    allocs = [max(item.lower, min(item.upper, fair_prop * rel[0])) for item, rel in zip(items, relative, strict=True)]
    return allocs, fair_prop


def reallocate(levels: Mapping[str, LevelSeats], observed: Mapping[str, Observation], nominal_sum: int) -> float:
    """kube's ``updateBorrowingLocked``: each level's demand statistics updated from its period's
    ``observed`` demand, then its ``current`` limit set; returns the fair fraction (kube's
    ``seat_fair_frac``). On an impossible allocation the limits stay as they were."""
    remaining = nominal_sum
    names: list[str] = []
    items: list[AllocItem] = []
    lower_sum = floor_sum = 0
    floors: dict[str, int] = {}
    for name, level in levels.items():
        if name in observed:
            level.stats.update(observed[name])
        hw = level.stats.high_watermark
        if level.exempt:
            floors[name] = max(level.lower, hw)
            remaining -= floors[name]
            continue
        floors[name] = floor = max(level.lower, min(level.nominal, hw))
        level.target = max(float(floor), level.stats.smoothed)
        names.append(name)
        items.append(AllocItem(float(floor), float(level.upper), level.target))
        lower_sum += level.lower
        floor_sum += floor
    # As kube: the exempt levels' use lowers what the others are guaranteed (``remaining``), but
    # the allocation shares the whole nominal sum.
    allocs: list[float] = []
    share = fair = 0.0
    if remaining <= lower_sum:
        pass
    elif remaining <= floor_sum:
        share = (remaining - lower_sum) / (floor_sum - lower_sum)
    else:
        try:
            allocs, fair = fair_alloc(nominal_sum, items)
        except ValueError:
            allocs = [float(levels[name].current) for name in names]
    index = {name: n for n, name in enumerate(names)}
    for name, level in levels.items():
        if level.exempt:
            level.current = floors[name]
        elif remaining <= lower_sum:
            level.current = level.lower
        elif remaining <= floor_sum:
            level.current = level.lower + go_round((floors[name] - level.lower) * share)
        else:
            level.current = go_round(allocs[index[name]])
    return fair

"""Borrowing between priority levels: kube's allocation of the seats by demand, its statistics, and the
controller's adjustment in simulated time (a busy level borrows an idle one's seats, and gives them back)."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchcache.fairness.borrowing import (
    AllocItem,
    DemandStats,
    LevelSeats,
    Observation,
    SeatDemand,
    fair_alloc,
    go_round,
    level_bounds,
    reallocate,
)
from watchcache.fairness.classify import RequestDigest
from watchcache.fairness.config import parse_flow_schema, parse_priority_level
from watchcache.fairness.controller import FlowControl


def test_go_round_takes_halves_away_from_zero() -> None:
    assert [go_round(x) for x in (0.5, 1.5, 2.5, 0.49, -0.5, 3.6)] == [1, 2, 3, 0, -1, 4]


def test_bounds_are_kubes_with_one_seat_kept() -> None:
    # kube's suggested levels at its 600 seats: workload-low 245 nominal, 90% lendable: 221 lent.
    assert level_bounds(245, 90, None, 600) == (24, 845)
    assert level_bounds(49, 50, None, 600) == (24, 649)  # global-default: round(24.5) = 25 lent
    assert level_bounds(10, 50, 20, 600) == (5, 12)  # borrowingLimitPercent 20: 2 more at most
    # A worker's few seats: kube's rounding would leave none; one is kept unless all are lendable.
    assert level_bounds(1, 50, None, 8) == (1, 9)
    assert level_bounds(4, 90, None, 8) == (1, 12)
    assert level_bounds(4, 100, None, 8) == (0, 12)
    assert level_bounds(0, 0, None, 8) == (0, 8)  # exempt: no nominal seats


def test_fair_alloc_hand_computed() -> None:
    # No bound matters: proportional to the targets, 10 / 4 = 2.5 each unit of target.
    allocs, fair = fair_alloc(10, [AllocItem(1, 10, 3), AllocItem(1, 10, 1)])
    assert allocs == pytest.approx([7.5, 2.5]) and fair == pytest.approx(2.5)
    # An upper bound binds: 7.5 > 4, so 4, and the other takes the rest, 6 (fair_prop 6).
    allocs, fair = fair_alloc(10, [AllocItem(0, 4, 3), AllocItem(0, 10, 1)])
    assert allocs == pytest.approx([4, 6]) and fair == pytest.approx(6)
    # A lower bound binds: 8 / 10 × 5 = 4 < 5, so 5, and the other 3 (fair_prop 3 / 5).
    allocs, fair = fair_alloc(8, [AllocItem(5, 10, 5), AllocItem(0, 10, 5)])
    assert allocs == pytest.approx([5, 3]) and fair == pytest.approx(0.6)
    # No room: the lower bounds sum to what is required.
    assert fair_alloc(6, [AllocItem(5, 10, 9), AllocItem(1, 10, 1)])[0] == [5, 1]
    # A target of zero counts as kube's MinTarget, 0.001: it gets next to nothing.
    allocs, _ = fair_alloc(12, [AllocItem(0, 20, 0), AllocItem(1, 20, 1)])
    assert allocs[0] == pytest.approx(12 * 0.001 / 1.001) and sum(allocs) == pytest.approx(12)
    with pytest.raises(ValueError):
        fair_alloc(4, [AllocItem(5, 10, 5)])  # the lower bounds exceed the sum
    with pytest.raises(ValueError):
        fair_alloc(40, [AllocItem(5, 10, 5)])  # the upper bounds fall short of it


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=9), st.data())
def test_fair_alloc_properties(raw: list[tuple[float, float, float]], data: st.DataObject) -> None:
    """kube's ``TestConcAlloc``: the allocations sum to what is required, each within its bounds and
    either fair_prop × target or at the bound that fair_prop × target passes."""
    items = [AllocItem(low, low + up, low + extra) for low, up, extra in raw]
    low, high = sum(i.lower for i in items), sum(i.upper for i in items)
    required = data.draw(st.integers(math.ceil(low), math.floor(high))) if math.ceil(low) <= high else None
    if required is None:
        return
    allocs, fair = fair_alloc(required, items)
    assert sum(allocs) == pytest.approx(required, rel=1e-9, abs=1e-9)
    for item, alloc in zip(items, allocs, strict=True):
        assert item.lower - 1e-9 <= alloc <= item.upper + 1e-9
        proportional = fair * max(item.target, 0.001)
        if proportional <= item.lower:
            assert alloc == item.lower
        elif proportional >= item.upper:
            assert alloc == item.upper
        else:
            assert alloc == pytest.approx(proportional, rel=1e-9)


def test_seat_demand_statistics() -> None:
    demand = SeatDemand(0.0)
    demand.set(0.0, 4)
    demand.set(5.0, 0)  # 4 seats for 5 s, then none for 5 s
    obs = demand.reset(10.0)
    assert (obs.duration, obs.average, obs.deviation, obs.max) == (10.0, 2.0, 2.0, 4)
    stats = DemandStats()
    stats.update(obs)
    # envelope = avg + stddev = 4; smoothed = max(4, 0.977 × 0 + 0.023 × 4)
    assert (stats.high_watermark, stats.smoothed) == (4, 4.0)
    stats.update(demand.reset(20.0))  # an idle period: the smoothed demand decays, half-life 5 min
    assert stats.high_watermark == 0 and stats.smoothed == pytest.approx(0.977 * 4)


def _level(nominal: int, lendable: int, server: int, hw: float, avg: float, exempt: bool = False) -> LevelSeats:
    lower, upper = level_bounds(nominal, lendable, None, server)
    seats = LevelSeats.initial(exempt, nominal, lower, upper)
    seats.stats.smoothed = avg
    return seats


def test_reallocate_hand_computed() -> None:
    # Two levels of 10 nominal seats (5 lendable) and catch-all's 1, 21 in all; one busy (40 seats of
    # demand), one idle. Targets 40, 5 (its guaranteed), 1: fair_prop 21/46 gives the idle one 2.3,
    # under its 5, and catch-all 0.46, under its 1; the busy one gets the rest: 15, 5 borrowed.
    levels = {"busy": _level(10, 50, 20, 0, 0), "idle": _level(10, 50, 20, 0, 0), "catch-all": _level(1, 0, 20, 0, 0)}
    steady = {"busy": Observation(10.0, 40.0, 0.0, 40.0), "idle": Observation(10.0, 0.0, 0.0, 0.0),
              "catch-all": Observation(10.0, 0.0, 0.0, 0.0)}  # fmt: skip
    fair = reallocate(levels, steady, 21)
    assert {n: lv.current for n, lv in levels.items()} == {"busy": 15, "idle": 5, "catch-all": 1}
    assert fair == pytest.approx(15 / 40) and levels["busy"].target == 40
    # An exempt level's use comes first: when it takes more than the others' guaranteed seats
    # leave, every level gets its guaranteed seats only.
    levels["exempt"] = _level(0, 0, 20, 0, 0, exempt=True)
    reallocate(levels, {"exempt": Observation(10.0, 15.0, 0.0, 15.0)}, 21)
    assert {n: lv.current for n, lv in levels.items()} == {"busy": 5, "idle": 5, "catch-all": 1, "exempt": 15}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 100), st.integers(0, 100), st.floats(0, 500)), min_size=1, max_size=8),
    st.integers(1, 600),
    st.booleans(),
)
def test_reallocate_properties(raw: list[tuple[int, int, float]], server: int, flooded: bool) -> None:
    """Every level stays within [lower, upper]; when every level's demand exceeds its nominal seats
    (demand over supply), the current limits add up to the sum of the nominal seats, but for Go's
    rounding (half a seat per level at most)."""
    levels: dict[str, LevelSeats] = {}
    observed: dict[str, Observation] = {}
    for n, (nominal, lendable, demand) in enumerate(raw):
        levels[f"l{n}"] = _level(nominal, lendable, server, 0, 0)
        if flooded:
            demand = nominal + demand
        observed[f"l{n}"] = Observation(10.0, demand, 0.0, demand)
    nominal_sum = sum(lv.nominal for lv in levels.values())
    reallocate(levels, observed, nominal_sum)
    for level in levels.values():
        assert level.lower <= level.current <= level.upper
    if flooded:
        assert abs(sum(lv.current for lv in levels.values()) - nominal_sum) <= len(levels) / 2


def _config(level_objects: list[dict]) -> tuple[list, list]:
    schemas = [
        {"kind": "FlowSchema", "metadata": {"name": name, "uid": f"fs-{name}"},
         "spec": {"priorityLevelConfiguration": {"name": name}, "matchingPrecedence": 500 + n,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": [{"kind": "Group", "group": {"name": name}}],
                             "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                "namespaces": ["*"], "clusterScope": True}]}]}}
        for n, name in enumerate(("busy", "idle"))
    ]  # fmt: skip
    return [parse_flow_schema(o) for o in schemas], [parse_priority_level(o) for o in level_objects]


def _limited(name: str, shares: int, lendable: int) -> dict:
    queuing = {"queues": 16, "handSize": 4, "queueLengthLimit": 50}
    limited = {
        "nominalConcurrencyShares": shares,
        "lendablePercent": lendable,
        "limitResponse": {"type": "Queue", "queuing": queuing},
    }
    return {
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name, "uid": f"pl-{name}"},
        "spec": {"type": "Limited", "limited": limited},
    }


def test_a_busy_level_borrows_from_an_idle_one_and_gives_back() -> None:
    asyncio.run(_busy_level_borrows())


async def _busy_level_borrows() -> None:
    now = [0.0]
    # 20 seats: busy and idle 10 nominal each (ceil(20 × 100 / 205)), 5 of them lendable; catch-all
    # (mandatory, 5 shares) 1; 21 in all.
    fc = FlowControl(20, clock=lambda: now[0])
    fc.configure(*_config([_limited("busy", 100, 50), _limited("idle", 100, 50)]))
    busy, idle = fc.levels["busy"], fc.levels["idle"]
    assert busy.queueset is not None and idle.queueset is not None
    assert (busy.seats.nominal, busy.seats.lower, busy.seats.upper, fc.nominal_sum) == (10, 5, 30, 21)

    def digest(group: str, user: str) -> RequestDigest:
        return RequestDigest(user, (group, "system:authenticated"), "list", True, resource="pods", namespace="n")

    async def flood(group: str) -> list[asyncio.Task]:
        c = fc.classify(digest(group, f"{group}-user"))
        tasks = [asyncio.create_task(fc.admit(c, None)) for _ in range(40)]
        await asyncio.sleep(0)
        return tasks

    busy_tasks = await flood("busy")
    assert busy.queueset.executing == busy.seats.current  # the rest wait: 40 seats of demand
    now[0] += 10.0  # kube's adjustment period, with the busy level's demand steady at 40
    fc.rebalance()
    await asyncio.sleep(0)
    assert (busy.seats.current, idle.seats.current, fc.levels["catch-all"].seats.current) == (15, 5, 1)
    assert busy.queueset.limit == 15 and busy.queueset.executing == 15  # 5 seats borrowed, in use at once
    idle_tasks = await flood("idle")
    assert idle.queueset.executing == 5  # its guaranteed seats, at once
    now[0] += 10.0  # both busy now: the idle level's demand (40) takes its lent seats back
    fc.rebalance()
    await asyncio.sleep(0)
    assert (busy.seats.current, idle.seats.current) == (10, 10)
    assert idle.queueset.executing == 10 and busy.queueset.executing == 15  # the busy level's go back as they end
    grants = [t.result() for t in busy_tasks if t.done()]
    for g in grants[:6]:
        g.release()
    await asyncio.sleep(0)
    assert busy.queueset.executing == 10  # 15 - 6 ended, one more dispatched: at its 10 again
    for t in [*busy_tasks, *idle_tasks]:
        t.cancel()
    fc.stop()


def test_the_first_request_arms_the_adjustment_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("watchcache.fairness.controller.PERIOD", 0.02)  # kube's 10 s, shortened
    asyncio.run(_timer())


async def _timer() -> None:
    fc = FlowControl(8)
    fc.configure(*_config([_limited("busy", 100, 50), _limited("idle", 100, 50)]))
    busy = fc.levels["busy"]
    assert fc._timer is None
    grants = [await fc.admit(fc.classify(RequestDigest("u", ("busy",), "get", True, resource="pods")), None)]
    assert fc._timer is not None and busy.seats.stats.high_watermark == 0
    await asyncio.sleep(0.1)  # a few adjustments: the seat in use was seen
    assert busy.seats.stats.high_watermark == 1 and busy.seats.stats.average == pytest.approx(1.0)
    for g in grants:
        g.release()
    fc.stop()
    assert fc._timer is None

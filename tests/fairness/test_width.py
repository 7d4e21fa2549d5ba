"""Work estimates: kube v1.36's LIST estimate by the memory its answer holds, capped per level."""

from __future__ import annotations

import pytest

from watchcache.fairness.width import ObjectStats, estimate, level_max_seats, list_seats

PODS = ObjectStats(count=1000, bytes=3_000_000)  # 3 kB each: 3 MB in all


def est(verb: str, query: dict[str, str], stats: ObjectStats | None = PODS, max_seats: int = 0, name: str = "") -> int:
    return estimate(verb, name, query.get, lambda: stats, max_seats)


def test_level_max_seats_is_kubes_fifteen_percent_or_nominal_over_hand_size() -> None:
    assert level_max_seats(33, 6) == 5  # min(ceil(4.95), 33 // 6)
    assert level_max_seats(164, 6) == 25  # min(ceil(24.6), 27)
    assert level_max_seats(245, 6) == 37  # kube's workload-low at its 600 seats: min(ceil(36.75), 40)
    assert level_max_seats(4, 6) == 1  # min(1, 0), at least 1
    assert level_max_seats(40, 2) == 6  # min(6, 20)
    assert level_max_seats(40, 0) == 0  # no queues: none of its own


def test_list_seats_by_memory_held_from_the_cache() -> None:
    # 3 MB of pods: a read from the cache holds at most 1 MB at once: 10 seats of 100 kB.
    assert list_seats(PODS, single=False, limit=0, max_seats=0) == 10
    assert list_seats(PODS, single=False, limit=0, max_seats=5) == 5  # the level's maximum
    assert list_seats(PODS, single=False, limit=100, max_seats=0) == 3  # 100 × 3 kB
    assert list_seats(PODS, single=False, limit=5000, max_seats=0) == 10  # limit above the count
    assert list_seats(PODS, single=True, limit=0, max_seats=0) == 1  # one object by name
    assert list_seats(ObjectStats(150, 150_000), single=False, limit=0, max_seats=0) == 2  # ceil(1.5)
    assert list_seats(ObjectStats(0, 0), single=False, limit=0, max_seats=0) == 1  # at least one
    # Objects of no known size are assumed kube's maxObjectSize (1.5 MB): the 1 MB cap.
    assert list_seats(ObjectStats(5, 0), single=False, limit=0, max_seats=0) == 10
    assert list_seats(None, single=False, limit=0, max_seats=5) == 1  # not cached here: one seat


def test_estimate_by_verb_and_options() -> None:
    def no_stats() -> ObjectStats:
        raise AssertionError("only a LIST or an initial-events WATCH asks for the object count")

    for verb in ("get", "create", "update", "patch", "delete", "deletecollection", "proxy"):
        assert estimate(verb, "", {}.get, no_stats, 5) == 1
    assert est("list", {}) == 10
    assert est("list", {}, max_seats=5) == 5
    assert est("list", {"labelSelector": "app=x"}) == 10  # from the cache: a full scan whatever the selector
    assert est("list", {"fieldSelector": "metadata.name=p1"}) == 1  # kube's RequestInfo names it
    assert est("list", {"fieldSelector": "spec.nodeName=n,metadata.name==p1"}) == 1
    assert est("list", {"fieldSelector": "metadata.name!=p1"}) == 10
    assert est("list", {"fieldSelector": "metadata.name=a/b"}) == 10  # not a name
    assert est("list", {}, name="p1") == 1
    assert est("list", {"limit": "100", "resourceVersion": "0"}) == 3
    assert est("list", {"limit": "-1"}) == 10  # not a positive limit: none


def test_a_watch_costs_a_list_only_with_initial_events() -> None:
    assert est("watch", {"resourceVersion": "123"}) == 1
    assert est("watch", {"resourceVersion": "123", "sendInitialEvents": "false"}) == 1
    assert est("watch", {"resourceVersion": "123", "sendInitialEvents": "true"}) == 10
    assert est("watch", {"sendInitialEvents": ""}) == 10  # apimachinery: any value but 0/false is true
    assert est("watch", {"resourceVersion": "0"}) == 10  # a legacy watch: its initial ADDED events
    assert est("watch", {}) == 10
    assert est("watch", {}, max_seats=2) == 2


@pytest.mark.parametrize("query", [{"limit": "abc"}, {"limit": ""}, {"limit": "1_0"}, {"timeoutSeconds": "x"},
                                   {"limit": str(2**63)}])  # fmt: skip
def test_options_that_do_not_convert_get_the_levels_maximum(query: dict[str, str]) -> None:
    # kube: "destined to fail in the validation layer": the maximum, the level's or the estimator's.
    assert est("list", query, max_seats=5) == 5
    assert est("list", query, max_seats=0) == 100
    assert est("watch", query, max_seats=7) == 7

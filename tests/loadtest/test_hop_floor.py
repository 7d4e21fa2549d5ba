"""Smoke run of loadtest/bench/hop_floor.py: every placement measured, in the BENCH line."""

from __future__ import annotations

import os

from tests.loadtest.benchrun import bench_json


def test_hop_floor_measures_each_placement_the_machine_has() -> None:
    result = bench_json("hop_floor", "--round-trips", "200", "--burst", "50")
    rows = {r["placement"]: r for r in result["rows"]}
    expected = {"one vCPU", "as Linux places them"} | ({"two vCPUs"} if len(os.sched_getaffinity(0)) > 1 else set())
    assert set(rows) == expected
    for r in rows.values():
        assert r["n"] == 200 and 0 < r["p50"] <= r["p99"] <= r["max"]
    assert result["round_trips"] == 200 and result["burst"] == 50

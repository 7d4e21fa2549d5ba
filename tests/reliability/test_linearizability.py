"""The linearizability checker catches what a stale cache would answer, and nothing else."""

from __future__ import annotations

import pytest

from harness.linearizability import History, Read, check


def history(*writes: tuple[str, float, float]) -> History:
    """Writes (register, start, end) in value order per register."""
    h = History()
    for register, start, end in writes:
        w = h.write_started(register, len(h.writes.get(register, [])), start)
        w.end = end
    return h


BASE = history(("a", 0, 1), ("b", 0, 1), ("a", 10, 12), ("b", 20, 22), ("a", 30, 32))


@pytest.mark.parametrize(
    ("start", "end", "values"),
    [
        pytest.param(5, 6, {"a": 0, "b": 0}, id="before-any-update"),
        pytest.param(11, 13, {"a": 0, "b": 0}, id="a1-in-flight-old-value"),
        pytest.param(11, 13, {"a": 1, "b": 0}, id="a1-in-flight-new-value"),
        pytest.param(25, 26, {"a": 1, "b": 1}, id="after-b1"),
        pytest.param(31, 40, {"a": 2, "b": 1}, id="latest"),
        pytest.param(11, 21, {"a": 1, "b": 1}, id="both-new-overlapping-both-writes"),
    ],
)
def test_linearizable_reads_pass(start: float, end: float, values: dict[str, int]) -> None:
    BASE.reads[:] = [Read("c", start, end, values)]
    assert check(BASE) == []


@pytest.mark.parametrize(
    ("start", "end", "values", "why"),
    [
        pytest.param(13, 14, {"a": 0, "b": 0}, "stale", id="stale-after-a-write-completed"),
        pytest.param(5, 6, {"a": 1, "b": 0}, "future", id="a-value-written-after-the-read"),
        pytest.param(5, 6, {"a": 7}, "never written", id="a-value-never-written"),
        # a=0 only until 12, b=1 only from 20: no instant of [11, 21] has both current.
        pytest.param(11, 21, {"a": 0, "b": 1}, "no single instant", id="torn-snapshot"),
    ],
)
def test_non_linearizable_reads_are_caught(start: float, end: float, values: dict[str, int], why: str) -> None:
    h = history(("a", 0, 1), ("b", 0, 1), ("a", 10, 12), ("b", 20, 22))
    if why == "no single instant":
        h = history(("a", 0, 1), ("b", 0, 1), ("a", 10, 12), ("b", 18, 20))
    h.reads[:] = [Read("c", start, end, values)]
    violations = check(h)
    assert len(violations) == 1 and why in violations[0].why, violations


def test_a_read_older_than_one_that_ended_before_it_began_is_caught() -> None:
    h = history(("a", 0, 1), ("a", 10, 20))  # a=1 in flight from 10 to 20
    h.reads[:] = [Read("c1", 11, 12, {"a": 1}), Read("c2", 13, 14, {"a": 0})]  # each alone could linearize
    violations = check(h)
    assert [v.read.client for v in violations] == ["c2"] and "older than 1" in violations[0].why


def test_writes_must_come_in_value_order() -> None:
    h = History()
    h.write_started("a", 0, 0.0)
    with pytest.raises(ValueError):
        h.write_started("a", 2, 1.0)

"""The 429's Retry-After per priority level, as kube's droppedRequestsTracker: doubled by a burst of
refusals (at most once per Retry-After), lowered by one a second when refusals stop, 1 to 32 s."""

from __future__ import annotations

from watchcache.fairness.dropped import MAX_RETRY_AFTER, DroppedRequests


def test_retry_after_doubles_under_refusals_and_comes_back_down() -> None:
    d = DroppedRequests()
    assert d.retry_after("workload-low") == 1
    for _ in range(5):
        d.record("workload-low", 100.2)
    assert d.retry_after("workload-low") == 1  # decided when the second changes
    d.record("workload-low", 101.0)  # 5 refusals in the last second >= 3 x 1
    assert d.retry_after("workload-low") == 2
    assert d.retry_after("global-default") == 1  # per level
    for _ in range(5):
        d.record("workload-low", 101.5)
    d.record("workload-low", 102.0)  # raised 1 s ago, less than its 2 s: not again yet
    assert d.retry_after("workload-low") == 2
    for second in range(102, 140):  # a steady flood: up to the cap
        for _ in range(100):
            d.record("workload-low", second + 0.5)
    assert d.retry_after("workload-low") == MAX_RETRY_AFTER
    d.record("workload-low", 200.0)  # quiet for a long while: one refusal lowers it by one
    assert d.retry_after("workload-low") == MAX_RETRY_AFTER - 1
    d.record("workload-low", 201.0)
    assert d.retry_after("workload-low") == MAX_RETRY_AFTER - 2

"""Flow control's metric families, under kube's names and labels (``util/flowcontrol/metrics``).

Read at scrape time from the controller's plain counters (``FlowStats``); kube's buckets for the
wait histogram. The proxy's own: a flow's pass-throughs at the upstream and in its line
(``Grant.upstream_turn``), and ``watchcache_flowcontrol_skipped_objects_total``: the
FlowSchemas and PriorityLevelConfigurations it could not follow (kube's validation refuses them
at write time; an apiserver of another version may serve what this one cannot read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.fairness.controller import SEATS_BUCKETS, WAIT_BUCKETS, FlowControl

__all__ = ["FlowControlCollector"]

_PF = "apiserver_flowcontrol_"
_LABELS = ["priority_level", "flow_schema"]
REASONS = ("cancelled", "concurrency-limit", "queue-full", "time-out")


class FlowControlCollector(Collector):
    def __init__(self, control: Callable[[], FlowControl | None]) -> None:
        self.control = control

    def collect(self) -> Iterator[Metric]:
        control = self.control()
        if control is None:
            return
        inqueue = GaugeMetricFamily(_PF + "current_inqueue_requests", "Requests pending in queues", labels=_LABELS)
        seats = GaugeMetricFamily(
            _PF + "current_executing_seats",
            "Seats occupied by executing requests (a watch's initial stage only)",
            labels=_LABELS,
        )
        executing = GaugeMetricFamily(
            _PF + "current_executing_requests", "Requests executing (a watch's initial stage only)", labels=_LABELS
        )
        dispatched = CounterMetricFamily(_PF + "dispatched_requests", "Requests executed", labels=_LABELS)
        rejected = CounterMetricFamily(
            _PF + "rejected_requests", "Requests rejected (queue-full, concurrency-limit, time-out, cancelled)",
            labels=[*_LABELS, "reason"],
        )  # fmt: skip
        waits = HistogramMetricFamily(
            _PF + "request_wait_duration_seconds", "Time a request spent waiting in its queue",
            labels=[*_LABELS, "execute"],
        )  # fmt: skip
        estimated = HistogramMetricFamily(
            _PF + "work_estimated_seats",
            "Number of estimated seats (maximum of initial and final seats) associated with requests in API "
            "Priority and Fairness",
            labels=_LABELS,
        )
        at_upstream = GaugeMetricFamily(
            "watchcache_flowcontrol_upstream_turns",
            "Pass-throughs at the upstream on one of their flow's turns (a flow has as many as its level has seats)",
            labels=_LABELS,
        )
        in_line = GaugeMetricFamily(
            "watchcache_flowcontrol_upstream_line_requests",
            "Pass-throughs waiting, without a seat, for one of their flow's turns at the upstream",
            labels=_LABELS,
        )
        for (level, schema), stats in sorted(control.stats.items()):
            labels = [level, schema]
            inqueue.add_metric(labels, stats.inqueue)
            at_upstream.add_metric(labels, stats.at_upstream)
            in_line.add_metric(labels, stats.in_line)
            seats.add_metric(labels, stats.seats)
            executing.add_metric(labels, stats.executing)
            dispatched.add_metric(labels, stats.dispatched)
            # Every reason, zeros included: an alert's rate() has a series before the first refusal.
            for reason in sorted({*REASONS, *stats.rejected}):
                rejected.add_metric([*labels, reason], stats.rejected.get(reason, 0))
            for execute, (counts, total) in sorted(stats.waits.items()):
                waits.add_metric([*labels, execute], _cumulative(WAIT_BUCKETS, counts), total[0])
            estimated.add_metric(labels, _cumulative(SEATS_BUCKETS, stats.estimates), stats.estimated)
        yield from (inqueue, seats, executing, dispatched, rejected, waits, estimated, at_upstream, in_line)
        yield from _borrowing(control)
        skipped = CounterMetricFamily(
            "watchcache_flowcontrol_skipped_objects",
            "FlowSchemas and PriorityLevelConfigurations skipped: the proxy could not follow them",
            labels=["kind"],
        )
        for kind, count in sorted(control.skipped.items()):
            skipped.add_metric([kind], count)
        yield skipped


def _borrowing(control: FlowControl) -> Iterator[Metric]:
    """Each level's seats (kube's gauges of apf_controller.go's borrowing), as of the last adjustment."""
    level = ["priority_level"]
    gauges = {
        "nominal_limit_seats": "Nominal number of execution seats configured for each priority level",
        "lower_limit_seats": "Configured lower bound on number of execution seats available to each priority level",
        "upper_limit_seats": "Configured upper bound on number of execution seats available to each priority level",
        "current_limit_seats": "current derived number of execution seats available to each priority level",
        "demand_seats_high_watermark": "High watermark, over last adjustment period, of demand_seats",
        "demand_seats_average": "Time-weighted average, over last adjustment period, of demand_seats",
        "demand_seats_stdev": "Time-weighted standard deviation, over last adjustment period, of demand_seats",
        "demand_seats_smoothed": "Smoothed seat demands",
        "target_seats": "Seat allocation targets",
    }
    families = {name: GaugeMetricFamily(_PF + name, text, labels=level) for name, text in gauges.items()}
    for name, pl in sorted(control.levels.items()):
        seats, stats = pl.seats, pl.seats.stats
        families["nominal_limit_seats"].add_metric([name], seats.nominal)
        families["lower_limit_seats"].add_metric([name], seats.lower)
        families["upper_limit_seats"].add_metric([name], seats.upper)
        families["current_limit_seats"].add_metric([name], seats.current)
        families["demand_seats_high_watermark"].add_metric([name], stats.high_watermark)
        families["demand_seats_average"].add_metric([name], stats.average)
        families["demand_seats_stdev"].add_metric([name], stats.deviation)
        families["demand_seats_smoothed"].add_metric([name], stats.smoothed)
        if not seats.exempt:
            families["target_seats"].add_metric([name], seats.target)
    yield from families.values()
    yield GaugeMetricFamily(
        _PF + "seat_fair_frac",
        "Fair fraction of server's concurrency to allocate to each priority level that can use it",
        value=control.fair_frac,
    )


def _le(bound: float) -> str:
    return repr(float(bound))


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one +Inf) as the cumulative buckets of a histogram."""
    total, buckets = 0, []
    for bound, count in zip([*map(_le, bounds), "+Inf"], counts, strict=True):
        total += count
        buckets.append((bound, float(total)))
    return buckets

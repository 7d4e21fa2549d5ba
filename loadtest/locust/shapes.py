"""Load profiles: one LoadTestShape, ``ProfileShape``, that follows ``--load-profile`` (run.py: ``--profile``).

It reads locust's own ``--users``, ``--spawn-rate`` and ``--run-time`` (``use_common_options``)
and ends the test at the run time. The ChurnUser is always one user (``fixed_count``) of the
``--users``.

| profile | users | what changes |
|---|---|---|
| steady | ListUser, WatchUser, InformerUser (3:4:2) + writer | nothing: a fixed mix |
| ramp | WatchUser + writer | watchers grow in ten steps to --users over 80% of the run |
| relist-storm | InformerUser + writer | at --storm-at of the run, every informer restarts at once |
| fanout | WatchUser + writer | every watcher watches the one namespace the writer churns |
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import gevent
from locust import LoadTestShape

from loadtest.locust.churn import ChurnUser
from loadtest.locust.context import RunContext, context_of
from loadtest.locust.informer import InformerUser
from loadtest.locust.listuser import ListUser
from loadtest.locust.serverstats import delta, snapshot
from loadtest.locust.watchuser import WatchUser

log = logging.getLogger("loadtest.shapes")

RAMP_STEPS = 10
RAMP_FRACTION = 0.8  # of the run time spent ramping; the rest holds the top
UNBOUNDED_RAMP = 60.0  # seconds, when there is no --run-time (web UI)
UNBOUNDED_STORM_AT = 30.0
STORM_SETTLE = 20.0  # seconds the storm waits for every informer to list and watch again
STORM_AFTERMATH = 2.0  # then this long, so the upstream's answer to the storm shows in its counters

PROFILE_CLASSES: dict[str, list[type]] = {
    "steady": [ListUser, WatchUser, InformerUser, ChurnUser],
    "ramp": [WatchUser, ChurnUser],
    "relist-storm": [InformerUser, ChurnUser],
    "fanout": [WatchUser, ChurnUser],
}


class ProfileShape(LoadTestShape):
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.storm: gevent.Greenlet | None = None

    def reset_time(self) -> None:
        super().reset_time()
        self.storm = None

    def tick(self) -> tuple[int, float, list[Any]] | None:
        assert self.runner is not None
        environment = self.runner.environment
        options = environment.parsed_options
        assert options is not None  # set by locust's runner before any shape tick
        run_time = float(options.run_time) if options.run_time else None
        t = self.get_run_time()
        if run_time is not None and t >= run_time:
            return None
        users, rate = max(2, int(options.num_users or 2)), float(options.spawn_rate or 1)
        profile = options.load_profile
        classes = PROFILE_CLASSES[profile]
        if profile == "ramp":
            ramp = RAMP_FRACTION * run_time if run_time else UNBOUNDED_RAMP
            step = min(RAMP_STEPS, math.floor(RAMP_STEPS * t / ramp) + 1)
            watchers = max(1, math.ceil((users - 1) * step / RAMP_STEPS))
            return watchers + 1, rate, classes
        if profile == "relist-storm" and self.storm is None:
            storm_at = options.storm_at * run_time if run_time else UNBOUNDED_STORM_AT
            if t >= storm_at:
                self.storm = gevent.spawn(run_storm, environment, context_of(environment))
        return users, rate, classes


def run_storm(environment: Any, ctx: RunContext) -> None:
    """Restart every informer at once; record upstream and proxy counters around it."""
    proxy, upstream, token = environment.host, ctx.settings.upstream_host, ctx.settings.token
    before = snapshot(proxy, upstream, token)
    lists_before = ctx.counters["informer lists"]
    started = time.time()
    restarted = ctx.restarts.restart_all()
    log.info("relist storm: restarted %d informers", restarted)
    gevent.sleep(0.5)
    while ctx.informers_watching < ctx.informers and time.time() - started < STORM_SETTLE:
        gevent.sleep(0.1)
    resynced = time.time() - started
    gevent.sleep(STORM_AFTERMATH)
    after = snapshot(proxy, upstream, token)
    ctx.storm = {
        "at": started,
        "informers_restarted": restarted,
        "informers": ctx.informers,
        "informers_watching_again": ctx.informers_watching,
        "seconds_to_resync": round(resynced, 2),
        "informer_lists_started": ctx.counters["informer lists"] - lists_before,
        "window_seconds": round(time.time() - started, 2),
        "before": before,
        "after": after,
        "upstream_delta": delta(before["upstream"], after["upstream"]),
        "proxy_delta": delta(before["proxy"], after["proxy"]),
        "upstream_list_count": None,  # the simulated cluster exposes no LIST counter
    }

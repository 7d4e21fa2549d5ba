"""Locust scenarios for watchcache: ``locust -f loadtest/locust/locustfile.py --host http://127.0.0.1:8080``,
from the repository's root (locust puts the working directory on ``sys.path``: ``loadtest.locust`` imports).

User classes (one module each): ``ListUser`` (paged/full/selector LISTs, GETs), ``WatchUser``
(long-lived watches timed by delivery latency), ``InformerUser`` (list-then-watch, relist on 410),
``ChurnUser`` (the stamped writer). ``ProfileShape`` (``shapes.py``) runs the ``--load-profile``
(``--profile`` is locust's own flag). ``python -m loadtest.locust.run`` wraps all this with a stack, CSV/HTML
reports, a plot and a summary; loadtest/README.md explains the numbers.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import gevent
from locust import events

from loadtest.locust.churn import ChurnUser
from loadtest.locust.config import add_arguments, settings_from
from loadtest.locust.context import RunContext, context_of, install
from loadtest.locust.informer import InformerUser
from loadtest.locust.listuser import ListUser
from loadtest.locust.serverstats import fetch_json, snapshot
from loadtest.locust.shapes import ProfileShape
from loadtest.locust.watchuser import WatchUser

__all__ = ["ChurnUser", "InformerUser", "ListUser", "ProfileShape", "WatchUser"]

log = logging.getLogger("loadtest")
CPU_SAMPLE_INTERVAL = 1.0


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    add_arguments(parser)


@events.test_start.add_listener
def _test_start(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    host = environment.host
    # rv=0: any cached state will do, and the proxy answers it without a consistent-read proof.
    doc = fetch_json(host, "/api/v1/namespaces?resourceVersion=0", options.token, timeout=10.0)
    found = [item["metadata"]["name"] for item in (doc or {}).get("items", [])]
    try:
        settings = settings_from(options, found)
    except ValueError as e:
        reach = "" if doc else f" (GET {host}/api/v1/namespaces failed: is the target up, is --token right?)"
        log.error("cannot start: %s%s", e, reach)
        environment.process_exit_code = 2
        if environment.runner is not None:
            gevent.spawn(environment.runner.quit)
        return
    context = RunContext(settings)
    install(environment, context)
    context.started = time.time()
    context.stats_before = snapshot(host, settings.upstream_host, settings.token)
    if environment.runner is not None:
        context.cpu_sampler = gevent.spawn(_sample_cpu, environment, context)
    log.info(
        "profile %s against %s: namespaces %s, writes to %s via %s at %.1f/s",
        settings.profile,
        host,
        ",".join(settings.namespaces),
        ",".join(settings.churn_namespaces),
        settings.writes_via,
        settings.churn_rate,
    )


def _sample_cpu(environment: Any, context: RunContext) -> None:
    while True:
        gevent.sleep(CPU_SAMPLE_INTERVAL)
        context.cpu.append(environment.runner.current_cpu_usage)


@events.test_stop.add_listener
def _test_stop(environment: Any, **_: Any) -> None:
    try:
        context = context_of(environment)
    except RuntimeError:
        return
    if context.cpu_sampler is not None:
        context.cpu_sampler.kill(block=False)
    prefix = environment.parsed_options.csv_prefix
    if not prefix:
        return
    cpu = [c for c in context.cpu if c]
    settings = context.settings
    extras = {
        "profile": settings.profile,
        "host": environment.host,
        "upstream_host": settings.upstream_host,
        "writes_via": settings.writes_via,
        "namespaces": list(settings.namespaces),
        "churn_namespaces": list(settings.churn_namespaces),
        "churn_rate": settings.churn_rate,
        "duration": round(time.time() - context.started, 1),
        "delivery_latency_ms": context.latencies.summary(),
        "counters": dict(context.counters),
        "locust_cpu_percent": {
            "mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "max": max(cpu) if cpu else None,
            "warning": bool(environment.runner and environment.runner.cpu_warning_emitted),
        },
        "server_counters": {
            "before": context.stats_before,
            "after": snapshot(environment.host, settings.upstream_host, settings.token),
        },
        "storm": context.storm,
    }
    Path(f"{prefix}_extras.json").write_text(json.dumps(extras, indent=2, default=str))

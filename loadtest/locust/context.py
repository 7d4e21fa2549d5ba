"""State shared by the users of one locust process, created when the test starts.

Everything here is owned by the process's gevent loop: greenlets only switch at I/O, so plain
dicts and counters need no locks.
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import gevent
from locust.exception import StopUser

from loadtest.locust.config import Settings
from loadtest.locust.latency import DeleteClock, LatencySamples


class Restarts:
    """The relist-storm's broadcast: every informer drops its watch and starts over at once.

    An informer registers the greenlet reading its watch; ``restart_all`` bumps ``epoch`` and kills
    those greenlets (the read raises GreenletExit, which closes the connection). An informer
    compares ``epoch`` before and after each step, so one caught between steps restarts too.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.readers: set[gevent.Greenlet] = set()

    def restart_all(self) -> int:
        self.epoch += 1
        readers, self.readers = self.readers, set()
        for reader in readers:
            reader.kill(block=False)
        return len(readers)


@dataclass
class RunContext:
    settings: Settings
    # Names of this process's writes, unique across runs against a long-lived cluster.
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    deletes: DeleteClock = field(default_factory=DeleteClock)
    latencies: LatencySamples = field(default_factory=LatencySamples)
    restarts: Restarts = field(default_factory=Restarts)
    # Things locust's request table does not show: relists, resumptions, problems by kind.
    counters: Counter[str] = field(default_factory=Counter)
    # Informers whose store is synced and whose watch is open, for the relist-storm's settle wait.
    informers_watching: int = 0
    informers: int = 0
    # How many users of each class have started: targets are dealt round-robin, so that even a
    # small run covers them (and two runs of one profile watch the same collections).
    started_users: Counter[str] = field(default_factory=Counter)
    # Cleared when the server rejects sendInitialEvents (an apiserver without WatchList): WatchUsers
    # then start with list-then-watch only.
    streaming_lists: bool = True
    storm: dict[str, Any] = field(default_factory=dict)
    # For the run's extras file (locustfile.py): when it started, server counters at the start,
    # locust's CPU samples (percent of one core, once a second) and the greenlet taking them.
    started: float = 0.0
    stats_before: dict[str, Any] = field(default_factory=dict)
    cpu: list[float] = field(default_factory=list)
    cpu_sampler: gevent.Greenlet | None = None

    def deal(self, kind: str) -> int:
        """The index of the next user of ``kind`` (0, 1, 2, ...)."""
        index = self.started_users[kind]
        self.started_users[kind] += 1
        return index


_ATTRIBUTE = "watchcache_loadtest"


def install(environment: Any, context: RunContext) -> None:
    setattr(environment, _ATTRIBUTE, context)


def context_of(environment: Any) -> RunContext:
    context = getattr(environment, _ATTRIBUTE, None)
    if context is None:
        raise RuntimeError("the load test's context is set at test_start (run locust with loadtest/locustfile.py)")
    return context


def user_context(environment: Any) -> RunContext:
    """The context for a starting user; a user of a test that failed to start stops quietly."""
    context = getattr(environment, _ATTRIBUTE, None)
    if context is None:
        raise StopUser  # test_start logged why
    return context


def report(
    environment: Any,
    request_type: str,
    name: str,
    response_time: float | None,
    length: int = 0,
    exception: Exception | None = None,
) -> None:
    """One row's sample in locust's statistics. ``response_time`` None: counted, not timed."""
    environment.events.request.fire(
        request_type=request_type,
        name=name,
        response_time=response_time,
        response_length=length,
        exception=exception,
        context={},
    )

"""Issue 34 item 3: the log says ``ready`` only when ``/readyz`` answers 200, else ``serving, not ready: why``,
each line once per change."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.support.factories import pod
from tests.support.handlers import FakeUpstream, arun
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS, ResourceRegistry
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext
from watchcache.service.readiness import GRACE, ReadinessLog
from watchcache.upstream.failures import LastFailures
from watchcache.watchers.flush import FlushScheduler

URL = "http://127.0.0.1:8080"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def handler_with_unsynced_pods() -> tuple[ApiHandler, Cacher]:
    cacher = Cacher(PODS, CacheConfig())
    ctx = ApiContext(
        registry=ResourceRegistry((PODS,)),
        cachers={PODS: cacher},
        upstream=FakeUpstream(),
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(asyncio.get_running_loop()),
    )
    ctx.upstream_failures = LastFailures("http://upstream:6443")
    return ApiHandler(ctx), cacher


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "watchcache"]


@arun
async def test_a_start_that_syncs_within_the_grace_logs_only_ready(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    handler, cacher = handler_with_unsynced_pods()
    clock = Clock()
    log = ReadinessLog("watchcache serve", URL, handler, lambda: "(1 resources)", clock)
    assert not log.check() and lines(caplog) == []
    clock.now += GRACE / 2
    cacher.replace([pod("p0", rv=1)], 5)
    assert log.check() and log.check()
    assert lines(caplog) == [(logging.INFO, f"watchcache serve ready: listening on {URL} (1 resources)")]


@arun
async def test_not_ready_after_the_grace_says_why_once_then_ready_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    handler, cacher = handler_with_unsynced_pods()
    clock = Clock()
    log = ReadinessLog("watchcache serve", URL, handler, str, clock)
    clock.now += GRACE
    for _ in range(5):
        assert not log.check()
    assert lines(caplog) == [
        (logging.INFO, f"watchcache serve serving, not ready: 1 of 1 caches not synced (pods); listening on {URL}")
    ]
    cacher.replace([], 5)
    for _ in range(5):
        assert log.check()
    assert [text for _, text in lines(caplog)][1:] == [f"watchcache serve ready: listening on {URL}"]


@arun
async def test_an_unreachable_upstream_is_said_at_once_with_its_hint(caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = handler_with_unsynced_pods()
    failures = handler.ctx.upstream_failures
    assert failures is not None
    failures.failed(None, "discovery", ConnectionRefusedError(111, "Connection refused"), 1.0)
    caplog.set_level(logging.INFO)
    log = ReadinessLog("watchcache serve", URL, handler, str, Clock())  # no grace waited
    assert not log.check()
    ((level, text),) = lines(caplog)
    assert level == logging.INFO
    assert text.startswith("watchcache serve serving, not ready: upstream discovery failed (refused): ")
    assert "nothing accepts connections at http://upstream:6443" in text and text.endswith(f"; listening on {URL}")


@arun
async def test_readiness_lost_later_is_a_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    handler, cacher = handler_with_unsynced_pods()
    cacher.replace([], 5)
    peers = [True]
    synced, unsynced = (True, "[+]workers-synced ok"), (False, "[-]workers-synced failed: workers [1] not synced")
    handler.readiness_checks.append(lambda: synced if peers[0] else unsynced)
    caplog.set_level(logging.INFO)
    log = ReadinessLog("w", URL, handler, str, Clock())
    assert log.check()
    peers[0] = False
    assert not log.check() and not log.check()
    peers[0] = True
    assert log.check()
    assert lines(caplog) == [
        (logging.INFO, f"w ready: listening on {URL}"),
        (logging.WARNING, f"w serving, not ready: workers-synced failed: workers [1] not synced; listening on {URL}"),
        (logging.INFO, f"w ready: listening on {URL}"),
    ]

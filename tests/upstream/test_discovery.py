"""upstream/discovery.py: what is not cached is said at the level an operator expects."""

from __future__ import annotations

import logging

import pytest

from watchcache.upstream.discovery import report_skipped

SKIPPED = [
    ("endpoints", "the upstream does not serve endpoints"),
    ("apps/v1/daemonsets", "the upstream does not serve apps/v1/daemonsets"),
]


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "watchcache.upstream.discovery"]


def test_defaults_the_upstream_does_not_serve_are_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="watchcache.upstream.discovery"):
        report_skipped(SKIPPED, requested=False)
    ((level, message),) = records(caplog)
    assert level == logging.INFO
    assert message.startswith("not caching endpoints, apps/v1/daemonsets: default resources the upstream does not")


def test_resources_named_in_the_flag_are_a_warning_each(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="watchcache.upstream.discovery"):
        report_skipped(SKIPPED, requested=True)
    assert records(caplog) == [
        (logging.WARNING, f"not caching {text} (--resources): the upstream does not serve {text}")
        for text in ("endpoints", "apps/v1/daemonsets")
    ]


def test_nothing_skipped_nothing_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="watchcache.upstream.discovery"):
        report_skipped([], requested=False)
    assert records(caplog) == []

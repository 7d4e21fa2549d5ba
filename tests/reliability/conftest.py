"""The reliability suite: the watch-guarantee checker, its clients, and the fault campaign."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "campaign: runs the 60-second fault campaign (real processes; about 90 s of wall time)"
    )

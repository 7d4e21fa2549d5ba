"""The recorded kube-apiserver answers, and an upstream that replays them, for every module here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.protobuf.recorded import RecordedUpstream, load


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def upstream(record: dict[str, Any]) -> Iterator[RecordedUpstream]:
    fake = RecordedUpstream(record)
    yield fake
    fake.stop()

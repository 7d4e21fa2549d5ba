"""The shard directory's names come from one place: what a worker makes is what the supervisor looks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchcache.service.options import ShardOptions
from watchcache.shard.layout import READY, SYNCED, ShardDir


def test_a_worker_and_the_supervisor_name_the_same_files(tmp_path: Path) -> None:
    worker = ShardOptions(worker_id=1, workers=3, shard_dir=str(tmp_path)).layout
    supervisor = ShardDir(tmp_path)
    assert worker == supervisor
    assert worker.socket(2) == str(tmp_path / "w2.sock")
    assert worker.marker(1, SYNCED) == tmp_path / "w1.synced"
    assert worker.marker(0, READY) == tmp_path / "w0.ready"
    assert worker.restarts_file == tmp_path / "restarts.json"


def test_an_unknown_marker_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        ShardDir(Path("/nonexistent")).marker(0, "done")

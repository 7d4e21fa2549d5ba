"""One backoff with jitter, and the retry loops that use it."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from watchcache.backoff import Backoff
from watchcache.shard.supervisor import Supervisor


def test_backoff_grows_with_jitter_and_caps():
    b = Backoff(1.0, 4.0)
    delays = [b.next() for _ in range(5)]
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0
    assert all(d <= 4.0 for d in delays) and delays[-1] >= 2.0
    b.reset()
    assert b.next() <= 1.0


def test_two_backoffs_do_not_retry_in_lockstep():
    a, b = Backoff(0.5, 10.0), Backoff(0.5, 10.0)
    assert [a.next() for _ in range(6)] != [b.next() for _ in range(6)]


@dataclass
class DeadProcess:
    """A worker process that has exited (what ``Supervisor._reap`` sees of it)."""

    pid: int
    returncode: int = 1

    def poll(self) -> int:
        return self.returncode


def test_workers_that_die_together_are_restarted_apart(monkeypatch):
    """The supervisor's restart delays are jittered: workers killed together do not come back together."""
    sup = Supervisor([], 8, "127.0.0.1", 0)
    try:
        monkeypatch.setattr(sup, "_spawn", lambda slot: None)
        starts: list[list[float]] = []
        for _ in range(3):
            for slot in sup.slots:
                slot.process = DeadProcess(pid=1000 + slot.id)  # type: ignore[assignment]
                slot.started, slot.next_start = time.monotonic(), 0.0
            sup._reap()
            starts.append([slot.next_start for slot in sup.slots])
        assert all(s == starts[0][0] for s in starts[0]), "the first restart is immediate"
        for later in starts[1:]:
            assert len(set(later)) > 1, f"restart times in lockstep: {later}"
    finally:
        shutil.rmtree(sup.shard_dir, ignore_errors=True)

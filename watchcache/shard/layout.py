"""The shard directory: the files through which a worker group's processes find each other.

The supervisor makes the directory (a fresh ``mkdtemp``) and hands it to every worker
(``--shard-dir``); this module alone names what is in it, so the supervisor that writes or waits
for a file and the worker that reads or makes it cannot disagree::

    <shard dir>/
      w<i>.sock            worker i's unix socket: the follow streams of the caches it owns, its metrics
      w<i>.ready           worker i listens (its pid inside)
      w<i>.synced          every cache worker i owns has synced; the group is ready once all are there
      restarts.json        written by the supervisor: restarts per worker (watchcache_worker_restarts_total)
      continue-token-key   the key that signs continue tokens, unless --continue-token-key-file names one
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

READY = "ready"
SYNCED = "synced"
MARKERS = (READY, SYNCED)


@dataclass(frozen=True)
class ShardDir:
    path: Path

    def socket(self, worker: int) -> str:
        """Worker ``worker``'s socket (a str: what asyncio's unix connections take)."""
        return str(self.path / f"w{worker}.sock")

    def marker(self, worker: int, name: str) -> Path:
        """``w<i>.ready`` / ``w<i>.synced``: files the supervisor and the other workers look for."""
        assert name in MARKERS, name
        return self.path / f"w{worker}.{name}"

    @property
    def restarts_file(self) -> Path:
        return self.path / "restarts.json"

    @property
    def continue_key(self) -> Path:
        return self.path / "continue-token-key"

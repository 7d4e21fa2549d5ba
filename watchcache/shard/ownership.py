"""Which worker owns which resource type: rendezvous (highest-random-weight) hashing.

Each (resource, worker) pair gets a pseudo-random weight; the owner is the worker with
the highest. Adding or removing a worker moves only the resources whose highest weight
was (or becomes) that worker's — about 1/W of them — and every process computes the same
map from the resource ids and the worker count alone, with no coordination.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(resource_id: str, worker: int) -> int:
    digest = hashlib.blake2b(f"{resource_id}\x00{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(resource_id: str, workers: int) -> int:
    if workers < 1:
        raise ValueError("at least one worker")
    return max(range(workers), key=lambda w: weight(resource_id, w))


def shard_map(resource_ids: Iterable[str], workers: int) -> dict[str, int]:
    return {r: owner_of(r, workers) for r in resource_ids}

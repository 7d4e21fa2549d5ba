"""The FNV-1a hash a ``shardSelector`` compares, per cached object, computed at most once.

Hashing is pure Python (~25 µs for a uid on a loaded machine), so it is paid lazily by the
first sharded read of an object, kept on the ``CachedObject`` (``uid_hash``) and carried to
the object's next versions by the store (a uid never changes). Deployments without sharded
clients pay nothing at ingest. Namespaces are few and shared by many objects: their hashes
are memoized by name.
"""

from __future__ import annotations

import orjson

from watchcache.cache.object import CachedObject
from watchcache.selectors.shards import NAMESPACE, ShardSelector, fnv1a_64

# Namespace -> hash. Bounded: cleared when it grows past this (a cluster has far fewer namespaces).
_NAMESPACE_HASHES: dict[str, int] = {}
_NAMESPACE_MEMO_LIMIT = 65536


def object_uid(obj: CachedObject) -> str:
    """``metadata.uid``, read from the body once when the encoder did not record it (a follower's copy)."""
    uid = obj.uid
    if uid is None:
        meta = orjson.loads(b"{" + obj.body).get("metadata")
        value = meta.get("uid") if isinstance(meta, dict) else None
        uid = obj.uid = value if isinstance(value, str) else ""
    return uid


def uid_hash(obj: CachedObject) -> int:
    value = obj.uid_hash
    if value is None:
        value = obj.uid_hash = fnv1a_64(object_uid(obj))
    return value


def namespace_hash(namespace: str) -> int:
    value = _NAMESPACE_HASHES.get(namespace)
    if value is None:
        if len(_NAMESPACE_HASHES) >= _NAMESPACE_MEMO_LIMIT:
            _NAMESPACE_HASHES.clear()
        value = _NAMESPACE_HASHES[namespace] = fnv1a_64(namespace)
    return value


def in_shard(selector: ShardSelector, obj: CachedObject) -> bool:
    """kube's ``MatchesSharding``: the field's hash is in one of the selector's ranges.

    A cluster-scoped object's namespace is "" (hashed as such, as kube does)."""
    if selector.field == NAMESPACE:
        return selector.contains(namespace_hash(obj.namespace))
    return selector.contains(uid_hash(obj))  # UID, the only other field the parser accepts

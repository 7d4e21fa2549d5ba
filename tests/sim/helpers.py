"""Shared bodies and assertions for the sim's tests."""

from __future__ import annotations

from typing import Any

import pytest

from watchcache.apierrors import StatusError
from watchcache.cache.object import CachedObject

WALL = 1_700_000_000.0  # 2023-11-14T22:13:20Z
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def pod(name: str = "web-1", namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app": "web"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "nginx"}]}, **extra}


def deployment(name: str = "web", replicas: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"replicas": replicas}}


def raises(code: int, reason: str, fn: Any, *args: Any) -> StatusError:
    with pytest.raises(StatusError) as info:
        fn(*args)
    assert (info.value.code, info.value.reason) == (code, reason), info.value
    return info.value


def meta_of(obj: CachedObject) -> dict[str, Any]:
    meta: dict[str, Any] = obj.decode()["metadata"]
    return meta

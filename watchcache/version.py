"""The program's version, as installed (``watchcache --version``, ``watchcache_build_info``)."""

from __future__ import annotations

import importlib.metadata


def version() -> str:
    """The installed distribution's version; a source tree that was never installed says so."""
    try:
        return importlib.metadata.version("watchcache")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"

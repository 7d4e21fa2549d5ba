"""LIST answers shared by identical LISTs at one snapshot: a memo per cache, kept by its ``Cacher``.

Keyed on the snapshot it was built from (its rv and the number of events at it), so it lives next
to the cache whose snapshots those are, not with the HTTP handlers that read it.
"""

from __future__ import annotations


class ListBodies:
    """The LIST answers built at a resource's newest snapshot, shared by identical LISTs at it.

    In a relist storm thousands of informers send the same LIST within moments (``resourceVersion=0``
    after a partition, a rollout, an upstream restart): each was scanned and framed again, ~30 ms of
    a worker's loop for 10,000 pods (docs/lab/performance-notebook.md, "Relist storm"). An answer is its snapshot's
    rv plus the request's own terms, so an identical request at the same rv gets the same parts (the
    cached object bytes, immutable). A snapshot is named by its rv and the number of events at it: an
    upstream that is a watch cache sends groups of events sharing one rv, and a read may end inside
    one, so the state at an rv can still grow. Entries are kept for one version, the newest one
    stored: a newer snapshot drops them, an older one (a continue page of an earlier list) is not
    kept, so at most ``MAX`` answers' references are held, of one generation of objects.
    """

    __slots__ = ("entries", "shared", "version")
    MAX = 8

    def __init__(self) -> None:
        # (rv, events at rv) of the entries.
        self.version = (-1, 0)
        self.entries: dict[tuple[object, ...], tuple[list[bytes], int, int]] = {}
        # LISTs answered with parts built for an earlier identical one (/debug/cache).
        self.shared = 0

    def get(self, version: tuple[int, int], key: tuple[object, ...]) -> tuple[list[bytes], int, int] | None:
        """The parts, items and objects examined of an identical LIST at ``version``, if built."""
        if version != self.version:
            return None
        built = self.entries.get(key)
        if built is not None:
            self.shared += 1
        return built

    def put(self, version: tuple[int, int], key: tuple[object, ...], built: tuple[list[bytes], int, int]) -> None:
        if version < self.version:
            return
        if version > self.version:
            self.entries.clear()
            self.version = version
        elif len(self.entries) >= self.MAX:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = built

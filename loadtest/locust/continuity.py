"""What a watch client may observe, checked event by event: the order of resourceVersions.

The guarantees (Kubernetes API concepts, "Efficient detection of changes"; docs/architecture.md
invariants 1-2): a watch started at rv ``S`` delivers only events with rv > ``S``, in
non-decreasing rv order; several objects may share one rv (an atomic change, or a relist diff),
but one object appears at most once per rv; a BOOKMARK at ``B`` promises every event with
rv ≤ ``B`` was sent. A client that resumes from the last rv it saw (events or bookmarks) sees
one continuous stream across reconnects, so one ``Continuity`` lives as long as that chain and is
``reset`` only when the client starts over (relist, 410).

Invariant kept here: ``floor ≤ last_rv`` never holds strictly for events (every event is > floor),
and ``keys_at_last`` holds exactly the keys of events delivered at ``last_rv``.
"""

from __future__ import annotations


class Continuity:
    __slots__ = ("floor", "keys_at_last", "last_rv")

    def __init__(self) -> None:
        # Events must be strictly newer than this: the watch's start rv, raised by each bookmark.
        self.floor = 0
        # The largest event rv seen, and which objects were delivered at it.
        self.last_rv = 0
        self.keys_at_last: set[str] = set()

    def reset(self) -> None:
        """The client starts over (a relist or a 410): nothing seen before binds what follows."""
        self.floor = 0
        self.last_rv = 0
        self.keys_at_last = set()

    def start(self, rv: int) -> None:
        """A watch (re)starts from ``rv``: only events after it may follow."""
        self.floor = max(self.floor, rv)

    @property
    def resume_rv(self) -> int:
        """Where a client-go reflector resumes: the newest rv it has seen, event or bookmark."""
        return max(self.floor, self.last_rv)

    def event(self, key: str, rv: int) -> str | None:
        """Record an event; the problem it reveals, if any (a gap or duplicate in the stream)."""
        if rv < self.last_rv:
            return f"resourceVersion went backwards: {key} at {rv} after {self.last_rv}"
        if rv <= self.floor:
            return f"event not after the watch's resourceVersion: {key} at {rv} ≤ {self.floor}"
        if rv == self.last_rv:
            if key in self.keys_at_last:
                return f"duplicate event: {key} at {rv}"
            self.keys_at_last.add(key)
        else:
            self.last_rv = rv
            self.keys_at_last = {key}
        return None

    def bookmark(self, rv: int) -> str | None:
        """Record a BOOKMARK; the problem it reveals, if any."""
        if rv < self.resume_rv:
            return f"bookmark went backwards: {rv} after {self.resume_rv}"
        self.floor = rv
        return None


class StoreCheck:
    """An informer's view of which objects exist, to catch events that contradict it.

    Without selectors, a watch never sends MODIFIED or DELETED for an object the client does not
    have, nor ADDED for one it has (kube-apiserver's watch cache; watchcache's relist sends the
    difference): any of these means an event was lost or repeated.
    """

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def replace(self, keys: set[str]) -> None:
        self.keys = keys

    def event(self, kind: str, key: str) -> str | None:
        present = key in self.keys
        if kind == "ADDED":
            self.keys.add(key)
            return f"ADDED for an object the informer already has: {key}" if present else None
        if kind == "DELETED":
            self.keys.discard(key)
            return None if present else f"DELETED for an object the informer never saw: {key}"
        if kind == "MODIFIED":
            return None if present else f"MODIFIED for an object the informer never saw: {key}"
        return None

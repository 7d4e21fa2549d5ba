"""The simulated cluster's commit journal: what etcd's WAL is to kube-apiserver.

One JSON line per commit, appended in commit order::

    {"rv":N,"r":"<resource path id>","t":"ADDED|MODIFIED|DELETED","o":{...the object...}}

``r`` is ``ResourceType.path_id()`` (``pods``, ``apps/v1/deployments``) and ``o`` the
object as cached (without ``kind``/``apiVersion``), copied from the cached bytes rather
than re-encoded. Replaying the lines in order rebuilds every resource's state and the
global revision (the last line's ``rv``).

Durability is against a killed *process*, not a crashed machine: each line is one
unbuffered ``os.write`` on an ``O_APPEND`` descriptor, so once ``append`` returns the
line is in the kernel's page cache and survives a SIGKILL (no fsync). A kill in the
middle of a write can leave a torn last line; ``open`` cuts it off (with a warning) so
that the next append starts on a line of its own, and ``replay`` ignores one it finds.

One writer at a time: ``open`` takes an exclusive ``flock`` on the file (released by
the kernel when the holder dies, so a SIGKILLed sim does not block its restart).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject, ObjectError, encode_object
from watchcache.resources import ResourceRegistry, ResourceType

log = logging.getLogger("watchcache.sim.journal")

Record = tuple[ResourceType, str, CachedObject, int]

_EVENT_TYPES = {ADDED: ADDED, MODIFIED: MODIFIED, DELETED: DELETED}
_READ_CHUNK = 1 << 16


class JournalError(Exception):
    """The journal cannot be used: held by another process, or corrupt before its last line."""


class Journal:
    """An append-only commit journal on one file; see the module docstring for the format."""

    def __init__(self, path: str | os.PathLike[str], fd: int) -> None:
        self.path = os.fspath(path)
        self._fd = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Journal:
        """Open (creating if absent) for appending; cuts off a torn last line left by a killed writer."""
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise JournalError(f"{os.fspath(path)}: journal is in use by another process") from None
            _cut_torn_tail(fd, os.fspath(path))
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def size(self) -> int:
        return os.fstat(self._check_open()).st_size

    def append(self, resource: ResourceType, event_type: str, obj: CachedObject, rv: int) -> None:
        """Write one commit's line; once this returns it survives the process being killed."""
        fd = self._check_open()
        line = b"".join(
            (
                b'{"rv":%d,"r":"%s","t":"%s","o":{' % (rv, resource.path_id().encode(), event_type.encode()),
                obj.body,
                b"}\n",
            )
        )
        written = os.write(fd, line)
        while written < len(line):  # regular files write whole buffers; be correct if one does not
            written += os.write(fd, memoryview(line)[written:])

    def replay(self, registry: ResourceRegistry) -> Iterator[Record]:
        """Every committed record, in commit order: ``(resource, event type, object, rv)``.

        Raises ``JournalError`` on a record that cannot be a commit of ``registry``'s
        types (unknown resource, bad JSON, rv not increasing) — except a torn last line
        without its newline, which is ignored with a warning.
        """
        fd = self._check_open()
        by_id = {t.path_id(): t for t in registry.types}
        last_rv = 0
        offset = 0
        pending = b""
        lineno = 0
        while True:
            chunk = os.pread(fd, 1 << 22, offset)
            if not chunk:
                break
            offset += len(chunk)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                lineno += 1
                resource, event_type, obj, rv = _parse(line, by_id, self.path, lineno)
                if rv <= last_rv:
                    raise JournalError(f"{self.path}:{lineno}: rv {rv} after {last_rv}")
                last_rv = rv
                yield resource, event_type, obj, rv
        if pending:
            log.warning("%s: ignoring a torn last record (%d bytes without a newline)", self.path, len(pending))

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # also releases the flock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _check_open(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: journal is closed")
        return self._fd


@dataclass
class JournalState:
    """What a replay leaves: each resource's objects and the global revision (0 if the journal is empty)."""

    objects: dict[ResourceType, dict[str, CachedObject]]
    rv: int
    records: int


def load_state(journal: Journal, registry: ResourceRegistry) -> JournalState:
    """Replay ``journal`` into final per-resource states, checking each record against the state before it."""
    objects: dict[ResourceType, dict[str, CachedObject]] = {t: {} for t in registry.types}
    rv = 0
    records = 0
    for resource, event_type, obj, rv in journal.replay(registry):
        records += 1
        state = objects[resource]
        present = obj.key in state
        if event_type == DELETED:
            if not present:
                raise JournalError(f"{journal.path}: rv {rv} deletes {resource.qualified} {obj.key!r}, which is absent")
            del state[obj.key]
        else:
            if present != (event_type == MODIFIED):
                why = "already present" if present else "absent"
                raise JournalError(f"{journal.path}: rv {rv} {event_type} {resource.qualified} {obj.key!r}: {why}")
            state[obj.key] = obj
    return JournalState(objects, rv, records)


def _parse(line: bytes, by_id: dict[str, ResourceType], path: str, lineno: int) -> Record:
    where = f"{path}:{lineno}"
    try:
        record = orjson.loads(line)
        rv = record["rv"]
        resource = by_id.get(record["r"])
        event_type = _EVENT_TYPES.get(record["t"])
        body = record["o"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as err:
        raise JournalError(f"{where}: not a journal record: {err}") from None
    if resource is None:
        raise JournalError(f"{where}: resource {record['r']!r} is not served by this registry")
    if event_type is None:
        raise JournalError(f"{where}: unknown event type {record['t']!r}")
    if not isinstance(rv, int) or not isinstance(body, dict):
        raise JournalError(f"{where}: malformed record")
    try:
        obj = encode_object(resource, body)
    except ObjectError as err:
        raise JournalError(f"{where}: {err}") from None
    if obj.rv != rv:
        raise JournalError(f"{where}: object resourceVersion {obj.rv} in the record of rv {rv}")
    return resource, event_type, obj, rv


def _cut_torn_tail(fd: int, path: str) -> None:
    """Truncate after the last newline, so a partial line from a killed writer never prefixes a new one."""
    size = end = os.fstat(fd).st_size
    while end > 0:
        start = max(0, end - _READ_CHUNK)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end < size:
        log.warning("%s: cutting off a torn last record (%d bytes without a newline)", path, size - end)
        os.ftruncate(fd, end)

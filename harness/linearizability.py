"""A linearizability check of consistent reads against writes, over a recorded history.

The history is built to make the check exact where it matters and cheap: a set of registers
(ConfigMaps), each written by one sequential writer with increasing values ``0, 1, 2, ...``
(a failed write is retried with the same value until it succeeds, so every value is written
once, within the call from its first try to its success), and readers that LIST them all, or GET
one, without a resourceVersion, recording each call's start and end on one monotonic clock.

A write of value ``v`` takes effect at some instant within its call; so value ``v`` of a register
is the current one at most from the start of ``v``'s write to the end of ``v+1``'s. A read is
linearizable only if one instant within its own call lies in that span for every register it
returned (a LIST is one snapshot), and registers never go back: a read that starts after another
read ended returns, for each register, a value at least as new. These are the conditions a
stale read breaks (the cache answering before it has a write that completed before the read
started, or one replica answering older than another did earlier); unlike a general
Porcupine search over every order of operations, they are checked in O(reads x registers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

INF = float("inf")


@dataclass
class Write:
    register: str
    value: int
    start: float  # the first try's start
    end: float = INF  # the successful try's end (INF: never acknowledged)


@dataclass
class Read:
    client: str
    start: float
    end: float
    values: Mapping[str, int]  # register -> value returned (a LIST: every register; a GET: one)
    kind: str = "list"


@dataclass
class Violation:
    read: Read
    why: str


@dataclass
class History:
    writes: dict[str, list[Write]] = field(default_factory=dict)  # register -> writes by value
    reads: list[Read] = field(default_factory=list)

    def write_started(self, register: str, value: int, at: float) -> Write:
        w = Write(register, value, at)
        writes = self.writes.setdefault(register, [])
        if len(writes) != value:
            raise ValueError(f"{register}: value {value} written out of order (have {len(writes)})")
        writes.append(w)
        return w

    @property
    def operations(self) -> int:
        return len(self.reads) + sum(len(ws) for ws in self.writes.values())


def check(history: History) -> list[Violation]:
    """Every read that cannot be linearized with the writes (see the module doc); [] if none."""
    violations: list[Violation] = []
    for read in history.reads:
        found = _read_violations(history, read)
        violations += found
    violations += _went_back(history.reads)
    return violations


def _read_violations(history: History, read: Read) -> list[Violation]:
    out: list[Violation] = []
    lo, hi = read.start, read.end  # the instants left at which every value so far was current
    for register, value in read.values.items():
        writes = history.writes.get(register, [])
        if not 0 <= value < len(writes):
            out.append(Violation(read, f"{register}={value}: a value never written"))
            continue
        current_from = writes[value].start
        current_until = writes[value + 1].end if value + 1 < len(writes) else INF
        if current_until <= read.start:
            out.append(
                Violation(read, f"{register}={value}: stale, value {value + 1} was written before the read began")
            )
        elif current_from >= read.end:
            out.append(Violation(read, f"{register}={value}: from the future, written after the read ended"))
        lo, hi = max(lo, current_from), min(hi, current_until)
    if not out and lo >= hi:
        out.append(Violation(read, "no single instant at which every value returned was current"))
    return out


def _went_back(reads: Sequence[Read]) -> list[Violation]:
    """Reads that returned a register older than a read that ended before they began."""
    out: list[Violation] = []
    by_start = sorted(reads, key=lambda r: r.start)
    by_end = sorted(reads, key=lambda r: r.end)
    newest: dict[str, int] = {}  # per register, the newest value of the reads ended so far
    i = 0
    for read in by_start:
        while i < len(by_end) and by_end[i].end < read.start:
            for register, value in by_end[i].values.items():
                if value > newest.get(register, -1):
                    newest[register] = value
            i += 1
        for register, value in read.values.items():
            seen = newest.get(register, -1)
            if value < seen:
                out.append(Violation(read, f"{register}={value}: older than {seen}, returned by a read that had ended"))
    return out

"""The watch-guarantee checker: what each client saw, against what the upstream committed.

Pure and independent of the product (it shares no code with ``watchcache``): its inputs are
the upstream's authoritative log of writes (the simulated cluster's journal, ``--state-file``)
and, per client, the recorded stream of what the client asked and received. Records are plain
tuples, built with the helpers below::

    ("list", rv, {key: object rv}, {key: digest} | None)   a complete (paged) LIST at rv
    ("reconnect", from_rv)                                   a WATCH request from from_rv
    ("event", type, key, object rv, digest | None)           ADDED / MODIFIED / DELETED
    ("bookmark", rv)
    ("error", code)           410 (HTTP or ERROR event: the chain ends, the client relists),
                              any other code (0: no connection): the attempt ended
    ("relist",)               the client starts over (informational; a "list" follows)

For each client, etcd's watch guarantees are verified (``KINDS``):

* **ordered** — object rvs strictly increase along the client's chain (list, then watches
  resumed from the last rv seen); equal rvs only for distinct keys of one atomic group;
* **unique** — no event twice (same key and rv, or an ADDED for a key the client holds);
* **reliable** — no gap: replaying the list and the events reproduces the upstream's state,
  filtered by the client's namespace and label selector, at every rv the client reached (a
  LIST must be exactly the state at its rv);
* **atomic** — events sharing an rv are never split by a bookmark;
* **resumable** — a watch resumed from r delivers exactly the events after r: none at or
  before r, none missing;
* **bookmarkable** — a BOOKMARK at r comes after every event ≤ r: the state matches at r.

How "every rv the client reached" is checked cheaply: the checker keeps the client's state
``C`` and the expected state ``E`` (the log, filtered, replayed up to a cursor), plus the set
``M`` of keys on which they differ, updated per change; a check at rv r advances ``E`` to r
and asks whether ``M`` is empty. Checks happen *before* each event (at its rv − 1: nothing
may be missing before it), *after* each rv group, at every bookmark, at every reconnect
(the client claims the state at its resume rv) and at the end.

The relist diff (``ResourceCache.relist``): after an upstream 410, the proxy delivers the
difference between its old state and a fresh list at R as events carrying the objects' own
rvs (≤ R; deletions stamped R - 1 but the last frame, at R), then a BOOKMARK at R.
Intermediate states of such a group are no state of the log, so failed checks inside it are
*pending*; they are accepted only when the group closes at an rv R in ``relist_rvs`` (the
proxy's relists, taken from its logs) — with a BOOKMARK at R, or with the client's state
matching the log's again at a check at or after R (a client of another tier in front of the
relisting proxy gets no bookmark at R) — with every key at most once, every event carrying
the key's state at R, and the state at R matching. Anything else is reported at its first
failing check, with the missing upstream change. ``relist_rvs="any"`` accepts a group at any
bookmark (weaker: use it only when the relist points are unknown); the default accepts none.
"""

from __future__ import annotations

import re
import zlib
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
BOOKMARK_T, ERROR_T = "BOOKMARK", "ERROR"  # watch event types that are not changes
KINDS = ("ordered", "unique", "reliable", "atomic", "resumable", "bookmarkable")
GONE = 410

Record = tuple[Any, ...]


# ---------------------------------------------------------------------------- records


def rec_list(rv: int, items: Mapping[str, int], digests: Mapping[str, int] | None = None) -> Record:
    return ("list", rv, dict(items), dict(digests) if digests is not None else None)


def rec_event(kind: str, key: str, rv: int, digest: int | None = None) -> Record:
    return ("event", kind, key, rv, digest)


def rec_bookmark(rv: int) -> Record:
    return ("bookmark", rv)


def rec_error(code: int) -> Record:
    return ("error", code)


def rec_reconnect(from_rv: int) -> Record:
    return ("reconnect", from_rv)


def rec_relist() -> Record:
    return ("relist",)


# ---------------------------------------------------------------------------- objects


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def digest_of(obj: Mapping[str, Any]) -> int:
    """A content digest independent of key order, without kind/apiVersion (the journal omits them)."""
    body = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return zlib.crc32(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One committed write of the upstream."""

    rv: int
    resource: str
    type: str
    key: str
    obj_rv: int
    labels: Mapping[str, str]
    digest: int | None = None


def parse_log_line(line: bytes | str, *, with_digest: bool = True) -> LogEntry:
    """A journal line ``{"rv":N,"r":"pods","t":"ADDED","o":{...}}``."""
    rec = orjson.loads(line)
    obj = rec["o"]
    meta = obj.get("metadata") or {}
    return LogEntry(
        rv=int(rec["rv"]),
        resource=rec["r"],
        type=rec["t"],
        key=object_key(obj),
        obj_rv=int(meta.get("resourceVersion") or rec["rv"]),
        labels=meta.get("labels") or {},
        digest=digest_of(obj) if with_digest else None,
    )


def read_log(path: str, *, with_digest: bool = True) -> list[LogEntry]:
    """The whole journal; a torn last line (a killed writer) is ignored, as the sim does."""
    out: list[LogEntry] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            out.append(parse_log_line(line, with_digest=with_digest))
    return out


# ---------------------------------------------------------------------------- selectors

_REQ = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[\w./-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<set>[^)]*)\))?)\s*$"
)


Labels = Mapping[str, str]


def _absent(key: str) -> Callable[[Labels], bool]:
    return lambda labels: key not in labels


def _present(key: str) -> Callable[[Labels], bool]:
    return lambda labels: key in labels


def _equals(key: str, value: str, equal: bool) -> Callable[[Labels], bool]:
    return lambda labels: (labels.get(key) == value) == equal


def _among(key: str, values: frozenset[str], inside: bool) -> Callable[[Labels], bool]:
    return lambda labels: (labels.get(key) in values) == inside


def label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-, set- and existence-based label selectors (``a=b,c!=d,e in (f,g),h,!i``)."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(selector):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for part in parts:
        if not part.strip():
            continue
        m = _REQ.match(part)
        if m is None:
            raise ValueError(f"unsupported label selector requirement {part!r}")
        if m["not"]:
            tests.append(_absent(m["nkey"]))
        elif m["op"] in ("=", "=="):
            tests.append(_equals(m["key"], m["val"], True))
        elif m["op"] == "!=":
            tests.append(_equals(m["key"], m["val"], False))
        elif m["setop"]:
            values = frozenset(s.strip() for s in m["set"].split(",") if s.strip())
            tests.append(_among(m["key"], values, m["setop"] == "in"))
        else:
            tests.append(_present(m["key"]))
    return lambda labels: all(t(labels) for t in tests)


@dataclass(frozen=True)
class WatchSpec:
    """What a client lists and watches."""

    resource: str
    namespace: str | None = None
    label_selector: str = ""

    def describe(self) -> str:
        where = f"-n {self.namespace}" if self.namespace else "-A"
        sel = f" -l {self.label_selector}" if self.label_selector else ""
        return f"{self.resource} {where}{sel}"


# ---------------------------------------------------------------------------- expected states

_SNAPSHOT_EVERY = 2000


class View:
    """The log of one resource filtered by a client's namespace and selector: changes of the visible state.

    ``changes[i] = (rv, key, object rv or None)``: after rv, key is visible at that version
    (None: not visible: deleted, or no longer selected).
    """

    def __init__(self, entries: Iterable[LogEntry], spec: WatchSpec) -> None:
        matches = label_matcher(spec.label_selector)
        prefix = spec.namespace + "/" if spec.namespace else None
        self.rvs: list[int] = []
        self.changes: list[tuple[int, str, int | None]] = []
        self._snapshots: list[tuple[int, dict[str, int]]] = [(0, {})]
        cur: dict[str, int] = {}
        for e in entries:
            if prefix is not None and not e.key.startswith(prefix):
                continue
            new = e.obj_rv if e.type != DELETED and matches(e.labels) else None
            old = cur.get(e.key)
            if new is None:
                if old is None:
                    continue
                del cur[e.key]
            else:
                cur[e.key] = new
            self.rvs.append(e.rv)
            self.changes.append((e.rv, e.key, new))
            if len(self.changes) % _SNAPSHOT_EVERY == 0:
                self._snapshots.append((len(self.changes), dict(cur)))
        self._by_key: dict[str, list[tuple[int, int | None]]] | None = None

    def state_at(self, rv: int) -> tuple[dict[str, int], int]:
        """The visible state at rv, and the index of the first change after rv."""
        end = bisect_right(self.rvs, rv)
        i = bisect_right([s[0] for s in self._snapshots], end) - 1
        start, snap = self._snapshots[i]
        state = dict(snap)
        for _, key, new in self.changes[start:end]:
            if new is None:
                state.pop(key, None)
            else:
                state[key] = new
        return state, end

    def by_key(self, key: str) -> list[tuple[int, int | None]]:
        if self._by_key is None:
            index: dict[str, list[tuple[int, int | None]]] = {}
            for rv, k, new in self.changes:
                index.setdefault(k, []).append((rv, new))
            self._by_key = index
        return self._by_key.get(key, [])

    def key_at(self, key: str, rv: int) -> int | None:
        history = self.by_key(key)
        i = bisect_right(history, rv, key=lambda c: c[0])
        return history[i - 1][1] if i else None

    def first_change(self, key: str, after: int, upto: int) -> tuple[int, int | None] | None:
        """The first change of key with after < rv ≤ upto (for reports: the missing event)."""
        for rv, new in self.by_key(key):
            if after < rv <= upto:
                return rv, new
        return None


class Upstream:
    """The authoritative log, indexed: per resource entries, content digests, filtered views."""

    def __init__(self, entries: Iterable[LogEntry]) -> None:
        self.by_resource: dict[str, list[LogEntry]] = {}
        self.versions: dict[tuple[str, str, int], LogEntry] = {}
        last = 0
        for e in entries:
            if e.rv < last:
                raise ValueError(f"log not in rv order: {e.rv} after {last}")
            last = e.rv
            self.by_resource.setdefault(e.resource, []).append(e)
            self.versions[(e.resource, e.key, e.obj_rv)] = e
        self.rv = last
        self._views: dict[WatchSpec, View] = {}

    def view(self, spec: WatchSpec) -> View:
        v = self._views.get(spec)
        if v is None:
            v = self._views[spec] = View(self.by_resource.get(spec.resource, []), spec)
        return v


# ---------------------------------------------------------------------------- results


@dataclass
class Violation:
    client: str
    kind: str
    rv: int
    index: int  # the record that revealed it
    expected: str
    seen: str

    def __str__(self) -> str:
        where = f"{self.client}: {self.kind} at rv {self.rv} (record {self.index})"
        return f"{where}: expected {self.expected}; saw {self.seen}"


@dataclass
class ClientStats:
    events: int = 0
    bookmarks: int = 0
    lists: int = 0
    reconnects: int = 0
    gone: int = 0
    errors: int = 0
    relist_groups: int = 0
    tolerated: int = 0  # idempotent replays let through by ``tolerate_replays``
    last_rv: int = 0


@dataclass
class ClientResult:
    client: str
    spec: WatchSpec
    violations: list[Violation] = field(default_factory=list)
    suppressed: int = 0
    stats: ClientStats = field(default_factory=ClientStats)


@dataclass
class _Pending:
    rv: int
    index: int
    kind: str
    expected: str
    seen: str


RelistRvs = Collection[int] | Literal["any"]


class ClientChecker:
    """Checks one client's records; see the module docstring for the rules."""

    def __init__(
        self,
        client: str,
        spec: WatchSpec,
        upstream: Upstream,
        relist_rvs: RelistRvs = (),
        *,
        max_reports: int = 20,
        tolerate_replays: bool = False,
    ) -> None:
        self.client = client
        # Count, instead of reporting, events that change nothing the client holds: a version it
        # already has, or a DELETED of a key that is absent both for the client and upstream (the
        # campaign's waiver for a known product bug; off by default).
        self.tolerate_replays = tolerate_replays
        self.spec = spec
        self.upstream = upstream
        self.view = upstream.view(spec)
        self.relist_rvs = relist_rvs
        self.max_reports = max_reports
        self.result = ClientResult(client, spec)
        self.stats = self.result.stats
        self.chain = False
        self._reset_chain()

    # ------------------------------------------------------------------ state

    def _reset_chain(self) -> None:
        self.C: dict[str, int] = {}
        self.E: dict[str, int] = {}
        self.M: set[str] = set()
        self.pos = 0  # index of the first view change not applied to E
        self.erv = 0
        self.cur = 0  # the client's position: list rv, last event rv or bookmark rv
        self.at_event = False  # cur is an event rv whose post-check is due
        self.keys_at_cur: set[str] = set()
        self.floor = 0  # every later event must be above this: watch start, bookmarks
        self.watch_start = 0
        self.fresh_watch = False  # a resumed watch has delivered nothing yet
        self.watched = False  # a watch was started since the list
        self.last_bookmark = 0
        self.events_before_bookmark: set[str] = set()  # keys delivered at last_bookmark's rv before it
        self.seen_rv: dict[str, int] = {}  # key -> rv of the last event/list item for it
        self.pending: list[_Pending] = []
        self.group: list[tuple[int, str, str, int]] = []  # (index, type, key, rv) since the last clean check

    def _report(self, kind: str, rv: int, index: int, expected: str, seen: str) -> None:
        if len(self.result.violations) >= self.max_reports:
            self.result.suppressed += 1
            return
        self.result.violations.append(Violation(self.client, kind, rv, index, expected, seen))

    def _advance(self, rv: int) -> None:
        changes = self.view.changes
        n = len(changes)
        E, C, M = self.E, self.C, self.M
        pos = self.pos
        while pos < n and changes[pos][0] <= rv:
            _, key, new = changes[pos]
            if new is None:
                E.pop(key, None)
            else:
                E[key] = new
            if C.get(key) == E.get(key):
                M.discard(key)
            else:
                M.add(key)
            pos += 1
        self.pos = pos
        self.erv = max(self.erv, rv)

    def _touch(self, key: str) -> None:
        if self.C.get(key) == self.E.get(key):
            self.M.discard(key)
        else:
            self.M.add(key)

    def _describe_mismatch(self, limit: int = 3) -> tuple[str, str]:
        exp, saw = [], []
        for key in sorted(self.M)[:limit]:
            e, c = self.E.get(key), self.C.get(key)
            missing = self.view.first_change(key, self.seen_rv.get(key, 0), self.erv)
            if missing is not None:
                rv, new = missing
                what = f"{'DELETED' if new is None else 'ADDED/MODIFIED'} {key}@{rv}"
            else:
                what = "no event (the client holds a version the log does not have at this rv)"
            exp.append(f"{key}@{e if e is not None else 'absent'} (missing: {what})")
            saw.append(f"{key}@{c if c is not None else 'absent'}")
        more = f" (+{len(self.M) - limit} more keys)" if len(self.M) > limit else ""
        return "; ".join(exp) + more, "; ".join(saw)

    def _check(self, rv: int, index: int, kind: str) -> bool:
        """Is the client's state the upstream's at rv? A failure becomes pending (see module doc)."""
        self._advance(rv)
        if not self.M:
            if not self.pending:
                self.group.clear()
            elif self._group_closed_by(rv):
                self._flush_pending(True)
            return True
        if not self.pending:
            exp, saw = self._describe_mismatch()
            self.pending.append(_Pending(rv, index, kind, exp, saw))
        return False

    def _resync(self) -> None:
        """After a reported gap, adopt the expected state so one fault is reported once."""
        for key in list(self.M):
            e = self.E.get(key)
            if e is None:
                self.C.pop(key, None)
            else:
                self.C[key] = e
        self.M.clear()

    def _group_fits(self, R: int) -> bool:
        """The pending events form a relist diff closing at R (see module doc)."""
        if self.relist_rvs != "any" and R not in self.relist_rvs:
            return False
        keys: set[str] = set()
        for _, kind, key, rv in self.group:
            if key in keys or rv > R:
                return False
            keys.add(key)
            at_r = self.view.key_at(key, R)
            if kind == DELETED:
                if at_r is not None:
                    return False
            elif at_r != rv:
                return False
        return True

    def _group_closed_by(self, rv: int) -> bool:
        """The client's state is the upstream's at rv again: the pending group was a relist diff closing
        at some R between its last event and rv (the diff's last frame carries R, so a client needs no
        BOOKMARK at R — the client of a tier in front of the relisting proxy gets none)."""
        if not self.group:
            return False
        top = max(r for _, _, _, r in self.group)
        if self.relist_rvs == "any":
            return self._group_fits(rv)
        return any(self._group_fits(R) for R in sorted(self.relist_rvs) if top <= R <= rv)

    def _partial_group_fits(self) -> bool:
        """A group cut short (the server then answered 410): it must fit some relist rv ≥ its events."""
        if not self.group:
            return False
        top = max(rv for _, _, _, rv in self.group)
        if self.relist_rvs == "any":
            candidates: Iterable[int] = [self.upstream.rv]
        else:
            candidates = sorted(r for r in self.relist_rvs if r >= top)[:3]
        return any(self._group_fits(R) for R in candidates)

    def _flush_pending(self, accepted: bool) -> None:
        if self.pending and not accepted:
            p = self.pending[0]
            self._report(p.kind, p.rv, p.index, p.expected, p.seen)
        elif self.pending:
            self.stats.relist_groups += 1
        self.pending = []
        self.group.clear()

    def _post_check(self, index: int) -> None:
        if self.at_event:
            self._check(self.cur, index, "resumable" if self.fresh_watch else "reliable")
            self.at_event = False

    # ------------------------------------------------------------------ records

    def run(self, records: Sequence[Record]) -> ClientResult:
        for index, rec in enumerate(records):
            handler = getattr(self, "_on_" + rec[0])
            handler(index, *rec[1:])
        self._finish(len(records))
        return self.result

    def _on_relist(self, index: int) -> None:
        pass

    def _on_list(self, index: int, rv: int, items: Mapping[str, int], digests: Mapping[str, int] | None) -> None:
        self.stats.lists += 1
        if self.chain and self.pending:
            self._post_check(index)
            self._flush_pending(self._partial_group_fits())
        self._reset_chain()
        self.chain = True
        expected, self.pos = self.view.state_at(rv)
        self.E = expected
        self.erv = rv
        self.C = dict(items)
        self.M = {k for k in expected.keys() | self.C.keys() if expected.get(k) != self.C.get(k)}
        self.seen_rv = dict(self.C)
        self.cur = self.floor = rv
        if self.M:
            exp, saw = self._describe_mismatch()
            self._report("reliable", rv, index, f"LIST at {rv} = upstream state: {exp}", saw)
            self._resync()
        if digests:
            for key, d in digests.items():
                self._check_digest(index, key, items[key], d, "LIST item")

    def _check_digest(self, index: int, key: str, rv: int, digest: int | None, what: str) -> None:
        entry = self.upstream.versions.get((self.spec.resource, key, rv))
        if entry is None:
            self._report("reliable", rv, index, f"{what} {key}@{rv} written by the upstream", "a version never written")
        elif digest is not None and entry.digest is not None and digest != entry.digest:
            self._report("reliable", rv, index, f"{what} {key}@{rv} with the upstream's content", "different content")

    def _on_reconnect(self, index: int, from_rv: int) -> None:
        self.stats.reconnects += 1
        if not self.chain:
            return
        self._post_check(index)
        if from_rv < self.cur:
            self._report("resumable", from_rv, index, f"resume from the last rv seen ({self.cur})", f"from {from_rv}")
        self.cur = max(self.cur, from_rv)
        self.floor = max(self.floor, from_rv)
        self.watch_start = from_rv
        # A resumption, as opposed to the first watch from the list's rv.
        self.fresh_watch = self.watched
        self.watched = True
        # The client claims the state at from_rv. If that fails (a relist group cut short), the
        # server must answer 410 (resolved in _on_error); if it streams on, the failure is reported.
        self._check(from_rv, index, "resumable")

    def _on_error(self, index: int, code: int) -> None:
        if code == GONE:
            self.stats.gone += 1
            if self.chain:
                self._post_check(index)
                self._flush_pending(not self.pending or self._partial_group_fits())
            self.chain = False
            self._reset_chain()
        else:
            self.stats.errors += 1

    def _on_bookmark(self, index: int, rv: int) -> None:
        self.stats.bookmarks += 1
        self.stats.last_rv = max(self.stats.last_rv, rv)
        if not self.chain:
            return
        if rv < self.cur:
            self._report("ordered", rv, index, f"a bookmark at or after {self.cur}", f"BOOKMARK at {rv}")
            return
        if self.at_event and rv == self.cur:
            self.events_before_bookmark = set(self.keys_at_cur)
        else:
            self.events_before_bookmark = set()
        self.at_event = False
        ok = self._check(rv, index, "bookmarkable")
        if self.pending:
            if ok and self._group_fits(rv):
                self._flush_pending(True)
            else:
                self._flush_pending(False)
                self._resync()
        self.group.clear()
        self.fresh_watch = False
        self.cur = rv
        self.floor = rv
        self.last_bookmark = rv

    def _on_event(self, index: int, kind: str, key: str, rv: int, digest: int | None) -> None:
        self.stats.events += 1
        self.stats.last_rv = max(self.stats.last_rv, rv)
        if not self.chain:
            self._report("unique", rv, index, "no event outside a list+watch chain", f"{kind} {key}@{rv}")
            return
        if rv <= self.floor or rv < self.cur or (rv == self.cur and not self.at_event):
            if self._idempotent(kind, key, rv):
                return
            if rv == self.last_bookmark and key not in self.events_before_bookmark and self.events_before_bookmark:
                vkind = "atomic"
            elif self.fresh_watch and rv <= self.watch_start:
                vkind = "resumable"
            elif rv <= self.last_bookmark:
                vkind = "bookmarkable"
            elif self.seen_rv.get(key) == rv:
                vkind = "unique"
            else:
                vkind = "ordered"
            self._report(vkind, rv, index, f"an event after rv {max(self.floor, self.cur)}", f"{kind} {key}@{rv}")
            return
        if rv == self.cur:
            if key in self.keys_at_cur:
                self._report("unique", rv, index, f"one event per key at rv {rv}", f"{kind} {key}@{rv} again")
                return
        else:
            checking = "resumable" if self.fresh_watch else "reliable"
            if self.at_event:
                self._check(self.cur, index, checking)
            if rv - 1 > self.cur or not self.at_event:
                self._check(rv - 1, index, checking)
            self.cur = rv
            self.at_event = True
            self.keys_at_cur = set()
        self._advance(rv)
        held = self.C.get(key)
        if kind == ADDED and held is not None:
            self._report(
                "unique", rv, index, f"{key} absent before its ADDED", f"ADDED {key}@{rv} while holding @{held}"
            )
        elif kind == DELETED and held is None and self._idempotent(kind, key, rv):
            pass
        elif kind in (MODIFIED, DELETED) and held is None:
            self._report(
                "reliable", rv, index, f"{key} present before its {kind}", f"{kind} {key}@{rv} of an unknown key"
            )
        if kind == DELETED:
            self.C.pop(key, None)
        else:
            self.C[key] = rv
            self._check_digest(index, key, rv, digest, kind)
        self.seen_rv[key] = rv
        self.keys_at_cur.add(key)
        self.group.append((index, kind, key, rv))
        self._touch(key)
        self.fresh_watch = False

    def _idempotent(self, kind: str, key: str, rv: int) -> bool:
        if not self.tolerate_replays:
            return False
        if kind == DELETED:
            self._advance(max(rv, self.cur))
            same = key not in self.C and key not in self.E
        else:
            same = self.C.get(key) == rv
        if same:
            self.stats.tolerated += 1
        return same

    def _finish(self, index: int) -> None:
        if not self.chain:
            return
        self._post_check(index)
        self._flush_pending(False)


@dataclass
class Report:
    clients: list[ClientResult]

    @property
    def violations(self) -> list[Violation]:
        return [v for c in self.clients for v in c.violations]

    @property
    def total_violations(self) -> int:
        return sum(len(c.violations) + c.suppressed for c in self.clients)

    def by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for v in self.violations:
            out[v.kind] = out.get(v.kind, 0) + 1
        return out


def check(
    log: Iterable[LogEntry] | Upstream,
    clients: Iterable[tuple[str, WatchSpec, Sequence[Record]]],
    relist_rvs: RelistRvs | Mapping[str, RelistRvs] = (),
    *,
    tolerate_replays: bool = False,
) -> Report:
    """Check every client; ``relist_rvs`` may be per resource (a mapping) or shared."""
    upstream = log if isinstance(log, Upstream) else Upstream(log)
    results = []
    for cid, spec, records in clients:
        rel = relist_rvs.get(spec.resource, ()) if isinstance(relist_rvs, Mapping) else relist_rvs
        results.append(ClientChecker(cid, spec, upstream, rel, tolerate_replays=tolerate_replays).run(records))
    return Report(results)


def iter_records(records: Iterable[Record]) -> Iterator[str]:
    """Human-readable records (for debugging a report)."""
    for i, rec in enumerate(records):
        yield f"{i}: {rec[0]} {' '.join(str(x) for x in rec[1:] if not isinstance(x, dict))}"

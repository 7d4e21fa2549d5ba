"""The checker must pass clean streams and catch every kind of violation in hand-made ones."""

from __future__ import annotations

import orjson
import pytest

from harness.checker import (
    ADDED,
    DELETED,
    MODIFIED,
    LogEntry,
    Upstream,
    WatchSpec,
    check,
    digest_of,
    label_matcher,
    parse_log_line,
    rec_bookmark,
    rec_error,
    rec_event,
    rec_list,
    rec_reconnect,
)

PODS = WatchSpec("pods")


def entry(rv: int, kind: str, key: str, **labels: str) -> LogEntry:
    return LogEntry(rv, "pods", kind, key, rv, labels)


# rv: 1 a+  2 b+  3 a~  4 c+  5 b-  6 a~  7 c~  8 a~ (tier leaves "web")  9 d+ (other namespace)
LOG = [
    entry(1, ADDED, "ns-0/a", tier="web"),
    entry(2, ADDED, "ns-0/b", tier="web"),
    entry(3, MODIFIED, "ns-0/a", tier="web"),
    entry(4, ADDED, "ns-0/c", tier="web"),
    entry(5, DELETED, "ns-0/b", tier="web"),
    entry(6, MODIFIED, "ns-0/a", tier="web"),
    entry(7, MODIFIED, "ns-0/c", tier="web"),
    entry(8, MODIFIED, "ns-0/a", tier="db"),
    entry(9, ADDED, "ns-1/d", tier="web"),
]

A, B, C, D = "ns-0/a", "ns-0/b", "ns-0/c", "ns-1/d"


def clean() -> list[tuple]:
    return [
        rec_list(2, {A: 1, B: 2}),
        rec_reconnect(2),
        rec_event(MODIFIED, A, 3),
        rec_event(ADDED, C, 4),
        rec_event(DELETED, B, 5),
        rec_bookmark(5),
        rec_event(MODIFIED, A, 6),
        rec_reconnect(6),  # the stream ended; resumed from the last rv seen
        rec_event(MODIFIED, C, 7),
        rec_event(MODIFIED, A, 8),
        rec_event(ADDED, D, 9),
        rec_bookmark(9),
    ]


def kinds(records: list[tuple], spec: WatchSpec = PODS, relist_rvs=()) -> list[str]:
    report = check(LOG, [("c1", spec, records)], relist_rvs)
    return [v.kind for v in report.violations]


def without(records: list[tuple], index: int) -> list[tuple]:
    return records[:index] + records[index + 1 :]


# ------------------------------------------------------------------ clean streams pass


def test_clean_stream_passes() -> None:
    report = check(LOG, [("c1", PODS, clean())])
    assert report.total_violations == 0
    stats = report.clients[0].stats
    assert (stats.events, stats.bookmarks, stats.reconnects, stats.last_rv) == (7, 2, 2, 9)


def test_clean_namespaced_and_selected_streams_pass() -> None:
    ns0 = WatchSpec("pods", "ns-0")
    records = [rec_list(3, {A: 3, B: 2}), rec_reconnect(3), rec_event(ADDED, C, 4), rec_event(DELETED, B, 5)]
    records += [rec_event(MODIFIED, A, 6), rec_event(MODIFIED, C, 7), rec_event(MODIFIED, A, 8)]
    records += [rec_bookmark(9)]  # d@9 is in ns-1: not this client's
    assert kinds(records, ns0) == []
    web = WatchSpec("pods", "ns-0", "tier=web")
    records = [rec_list(6, {A: 6, C: 4}), rec_reconnect(6), rec_event(MODIFIED, C, 7)]
    records += [rec_event(DELETED, A, 8), rec_bookmark(9)]  # a leaves the selection at 8
    assert kinds(records, web) == []


def test_relist_after_410_passes() -> None:
    records = [rec_list(2, {A: 1, B: 2}), rec_reconnect(2), rec_event(MODIFIED, A, 3), rec_error(410)]
    records += [rec_list(7, {A: 6, C: 7}), rec_reconnect(7), rec_event(MODIFIED, A, 8), rec_bookmark(8)]
    report = check(LOG, [("c1", PODS, records)])
    assert report.total_violations == 0
    assert report.clients[0].stats.gone == 1


def relist_group() -> list[tuple]:
    # The proxy relisted at 7 from its state at 2: a's and c's newest versions, b deleted (stamped 7).
    return [
        rec_list(2, {A: 1, B: 2}),
        rec_reconnect(2),
        rec_event(MODIFIED, A, 6),
        rec_event(ADDED, C, 7),
        rec_event(DELETED, B, 7),
        rec_bookmark(7),
        rec_event(MODIFIED, A, 8),
        rec_bookmark(8),
    ]


def test_relist_diff_group_is_accepted_at_a_known_relist_rv() -> None:
    report = check(LOG, [("c1", PODS, relist_group())], relist_rvs={7})
    assert report.total_violations == 0
    assert report.clients[0].stats.relist_groups == 1


def test_relist_diff_group_is_a_gap_when_no_relist_happened_there() -> None:
    assert kinds(relist_group(), relist_rvs=()) == ["reliable"]
    assert kinds(relist_group(), relist_rvs={8}) == ["reliable"]


def test_relist_diff_group_ending_with_a_frame_at_the_relist_rv_needs_no_bookmark() -> None:
    # The proxy's diff ends with its only frame at R (b's deletion stamped R - 1, c at its own rv 7 = R);
    # a client of another watch cache in front of it gets no BOOKMARK at R, but the next event.
    records = [rec_list(2, {A: 1, B: 2}), rec_reconnect(2), rec_event(MODIFIED, A, 6), rec_event(DELETED, B, 6)]
    records += [rec_event(ADDED, C, 7), rec_event(MODIFIED, A, 8), rec_bookmark(8)]
    report = check(LOG, [("c1", PODS, records)], relist_rvs={7})
    assert report.total_violations == 0 and report.clients[0].stats.relist_groups == 1
    assert kinds(records, relist_rvs={5}) == ["reliable"]  # no relist there: a gap


def test_relist_group_cut_short_then_410_is_accepted() -> None:
    records = [*relist_group()[:3], rec_reconnect(6), rec_error(410), rec_list(9, {A: 8, C: 7, D: 9})]
    assert kinds(records, relist_rvs={7}) == []


# ------------------------------------------------------------------ each violation is caught


def test_dropped_event_is_a_gap() -> None:
    assert kinds(without(clean(), 3)) == ["reliable"]  # c's ADDED at 4


def test_dropped_event_healed_by_a_later_one_is_still_a_gap() -> None:
    # a@3 dropped; a@6 later brings a's version back in line before the next bookmark.
    records = without(clean(), 2)
    assert kinds(records) == ["reliable"]
    report = check(LOG, [("c1", PODS, records)])
    v = report.violations[0]
    assert v.rv == 3 and "ns-0/a@3" in v.expected and "ns-0/a@1" in v.seen


def test_duplicate_event() -> None:
    records = clean()
    records.insert(3, rec_event(MODIFIED, A, 3))
    assert kinds(records) == ["unique"]


def test_duplicate_added() -> None:
    records = clean()
    records.insert(4, rec_event(ADDED, A, 4))  # a second ADDED of a key the client holds
    assert "unique" in kinds(records)


def test_reordered_events() -> None:
    records = clean()
    records[2], records[3] = records[3], records[2]  # c@4 before a@3
    assert kinds(records)[0] == "ordered"


def test_event_repeated_after_resume() -> None:
    records = clean()
    records.insert(8, rec_event(MODIFIED, A, 6))  # resumed from 6, then a@6 again
    assert kinds(records) == ["resumable"]


def test_event_missing_after_resume() -> None:
    records = without(clean(), 8)  # c@7, the first event after the resume from 6
    assert kinds(records) == ["resumable"]


def test_resume_from_an_older_rv_than_seen() -> None:
    records = clean()
    records[7] = rec_reconnect(5)
    assert "resumable" in kinds(records)


def test_bookmark_before_its_events() -> None:
    records = clean()
    records[4], records[5] = records[5], records[4]  # BOOKMARK 5 before b's DELETED at 5
    assert kinds(records)[0] == "bookmarkable"


def test_event_not_after_a_bookmark() -> None:
    records = clean()
    records.insert(6, rec_event(MODIFIED, A, 3))  # after BOOKMARK 5
    assert kinds(records) == ["bookmarkable"]


def test_atomic_group_split_by_a_bookmark() -> None:
    log = [*LOG, LogEntry(10, "pods", DELETED, A, 10, {}), LogEntry(10, "pods", DELETED, C, 10, {})]
    records = [*clean(), rec_event(DELETED, A, 10), rec_bookmark(10), rec_event(DELETED, C, 10), rec_bookmark(10)]
    report = check(log, [("c1", PODS, records)])
    assert "atomic" in [v.kind for v in report.violations]
    assert check(log, [("c1", PODS, without(records, 13))]).total_violations == 0


def test_list_that_is_not_the_state_at_its_rv() -> None:
    records = clean()
    records[0] = rec_list(2, {A: 1})
    assert kinds(records) == ["reliable"]


def test_event_of_a_version_never_written() -> None:
    records = clean()
    records[2] = rec_event(MODIFIED, A, 4)  # rv 4 is c's ADDED, not a version of a
    assert "reliable" in kinds(records) or "ordered" in kinds(records)


def test_wrong_content() -> None:
    obj = {"metadata": {"name": "a", "namespace": "ns-0", "resourceVersion": "1"}, "spec": {"x": 1}}
    line = orjson.dumps({"rv": 1, "r": "pods", "t": ADDED, "o": obj})
    log = [parse_log_line(line)]
    good = digest_of({"kind": "Pod", "apiVersion": "v1", **obj})
    bad = digest_of({**obj, "spec": {"x": 2}})
    ok = [rec_list(0, {}), rec_reconnect(0), rec_event(ADDED, A, 1, good), rec_bookmark(1)]
    assert check(log, [("c", PODS, ok)]).total_violations == 0
    wrong = [rec_list(0, {}), rec_reconnect(0), rec_event(ADDED, A, 1, bad), rec_bookmark(1)]
    assert [v.kind for v in check(log, [("c", PODS, wrong)]).violations] == ["reliable"]


def test_missed_selector_transition() -> None:
    web = WatchSpec("pods", "ns-0", "tier=web")
    records = [rec_list(6, {A: 6, C: 4}), rec_reconnect(6), rec_event(MODIFIED, C, 7), rec_bookmark(9)]
    assert kinds(records, web) == ["bookmarkable"]


def test_relist_group_with_a_key_twice_is_rejected() -> None:
    # c twice (its ADDED at 4, then its version at 7): the final state matches, yet no diff looks like this.
    records = relist_group()
    records[3:4] = [rec_event(ADDED, C, 4), rec_event(MODIFIED, A, 6), rec_event(MODIFIED, C, 7)]
    del records[2]
    assert kinds(records, relist_rvs={7}) == ["reliable"]


def test_partial_relist_group_resumed_instead_of_410_is_rejected() -> None:
    records = [*relist_group()[:3], rec_reconnect(6), rec_event(MODIFIED, C, 7), rec_bookmark(8)]
    assert kinds(records, relist_rvs={7}) != []


def test_label_selectors() -> None:
    m = label_matcher("app=web,tier!=db,env in (prod, staging),owner,!legacy")
    assert m({"app": "web", "env": "prod", "owner": "x"})
    assert not m({"app": "web", "env": "prod", "owner": "x", "legacy": "1"})
    assert not m({"app": "web", "env": "dev", "owner": "x"})
    assert not m({"app": "web", "tier": "db", "env": "prod", "owner": "x"})
    assert label_matcher("")({})
    assert label_matcher("env notin (prod)")({"env": "dev"})
    with pytest.raises(ValueError):
        label_matcher("a=b=c")


def test_upstream_views_are_shared_and_states_exact() -> None:
    up = Upstream(LOG)
    assert up.view(PODS) is up.view(WatchSpec("pods"))
    assert up.view(PODS).state_at(5)[0] == {A: 3, C: 4}
    assert up.view(WatchSpec("pods", "ns-0", "tier=web")).state_at(8)[0] == {C: 7}


def test_idempotent_replays_are_counted_only_when_tolerated() -> None:
    # After a resume from 6, a@6 again (a version held) and b's DELETED again (absent for both).
    records = clean()
    records[8:8] = [rec_event(MODIFIED, A, 6), rec_event(DELETED, B, 7)]
    assert kinds(records) == ["resumable", "reliable"]
    report = check(LOG, [("c1", PODS, records)], tolerate_replays=True)
    assert report.total_violations == 0
    assert report.clients[0].stats.tolerated == 2
    # A replay that changes the client's state is never tolerated.
    records = clean()
    records[8:8] = [rec_event(MODIFIED, A, 3)]
    assert check(LOG, [("c1", PODS, records)], tolerate_replays=True).total_violations == 1

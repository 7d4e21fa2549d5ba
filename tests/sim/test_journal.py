"""The sim's state file: a commit journal replayed on restart to the same objects and revision."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.sim.helpers import MERGE, WALL, deployment, pod
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.resources import CONFIGMAPS, DEPLOYMENTS, NAMESPACES, NODES, PODS, ResourceRegistry
from watchcache.sim.cluster import INITIAL_NAMESPACES, SimCluster
from watchcache.sim.journal import Journal, JournalError

REPO = Path(__file__).resolve().parents[2]


def open_sim(path: Path, seed: int = 7) -> SimCluster:
    return SimCluster(clock=lambda: 100.0, wall_clock=lambda: WALL, seed=seed, state_file=path)


def dump(sim: SimCluster) -> dict[str, list[bytes]]:
    """Every resource's objects as typed JSON, in key order."""
    return {
        r.path_id(): [o.typed_json(r) for o in c.cache.snapshot().iter_range("", None)] for r, c in sim.cachers.items()
    }


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def busy_sim(path: Path) -> SimCluster:
    sim = open_sim(path)
    sim.create(PODS, "default", pod("web-1"))
    sim.create(PODS, "default", pod("web-2"))
    sim.create(NODES, "", {"metadata": {"name": "n1", "labels": {"zone": "a"}}})
    sim.create(CONFIGMAPS, "kube-system", {"metadata": {"name": "cfg"}, "data": {"k": 'v\n\u00e9"x'}})
    sim.create(DEPLOYMENTS, "default", deployment(replicas=2))
    sim.patch(PODS, "default", "web-1", MERGE, b'{"status":{"phase":"Running","podIP":"10.0.0.1"}}')
    sim.patch(DEPLOYMENTS, "default", "web", MERGE, b'{"spec":{"replicas":3}}')
    sim.delete(PODS, "default", "web-2")
    return sim


# ---------------------------------------------------------------------- restart


def test_fresh_state_file_journals_the_default_namespaces(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = open_sim(path)
    assert not sim.restored
    records = [orjson.loads(line) for line in lines(path)]
    assert [(r["rv"], r["r"], r["t"], r["o"]["metadata"]["name"]) for r in records] == [
        (2 + i, "namespaces", "ADDED", name) for i, name in enumerate(INITIAL_NAMESPACES)
    ]
    # The object is written as cached: no TypeMeta, the same bytes the cache serves.
    ns = sim.get(NAMESPACES, "", "default")
    assert ns is not None and lines(path)[0].endswith(b',"o":{' + ns.body + b"}")
    sim.close()


def test_empty_state_file_starts_like_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    path.touch()
    sim = open_sim(path)
    assert not sim.restored and sim.rv == 1 + len(INITIAL_NAMESPACES)
    assert len(lines(path)) == len(INITIAL_NAMESPACES)
    sim.close()


def test_restart_restores_objects_and_revision_and_keeps_counting(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = busy_sim(path)
    before, rv = dump(sim), sim.rv
    assert len(lines(path)) == sim.commits() == rv - 1  # one line per commit
    sim.close()

    again = open_sim(path, seed=8)
    assert again.restored
    assert dump(again) == before
    assert again.rv == rv and all(c.ready and c.rv == rv for c in again.cachers.values())
    assert again.commits() == 0  # the default namespaces were restored, not created again
    assert len(lines(path)) == rv - 1
    created = again.create(PODS, "default", pod("web-3"))
    assert created.rv == again.rv == rv + 1
    after = dump(again)
    again.close()

    third = open_sim(path)
    assert dump(third) == after and third.rv == rv + 1
    third.close()


def test_restarted_history_starts_at_the_restart_point(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = busy_sim(path)
    old_rv = sim.rv - 2
    assert sim.cachers[PODS].cache.events_since(old_rv)  # resumable before the restart
    sim.close()
    again = open_sim(path)
    cache = again.cachers[PODS].cache
    assert cache.oldest_rv == again.rv and len(cache.history) == 0
    with pytest.raises(ResourceVersionTooOld):  # a watch from before the restart gets 410 and relists
        cache.events_since(old_rv)
    assert cache.events_since(again.rv) == []
    again.close()


def test_deletes_and_namespace_cascades_are_replayed(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = open_sim(path)
    sim.create(NAMESPACES, "", {"metadata": {"name": "team"}})
    for i in range(3):
        sim.create(PODS, "team", pod(f"p{i}"))
    sim.create(CONFIGMAPS, "team", {"metadata": {"name": "cfg"}})
    sim.create(PODS, "default", pod("stays"))
    sim.create(PODS, "default", pod("goes"))
    sim.delete(PODS, "default", "goes")
    written = len(lines(path))
    sim.delete(NAMESPACES, "", "team")
    cascade = [orjson.loads(line) for line in lines(path)[written:]]
    # One record per deleted object, at consecutive revisions, the namespace last.
    assert [(r["t"], r["r"], r["o"]["metadata"]["name"]) for r in cascade] == [
        ("DELETED", "pods", "p0"),
        ("DELETED", "pods", "p1"),
        ("DELETED", "pods", "p2"),
        ("DELETED", "configmaps", "cfg"),
        ("DELETED", "namespaces", "team"),
    ]
    assert [r["rv"] for r in cascade] == list(range(sim.rv - 4, sim.rv + 1))
    before, rv = dump(sim), sim.rv
    sim.close()

    again = open_sim(path)
    assert dump(again) == before and again.rv == rv
    assert [o.name for o in again.cachers[PODS].cache.snapshot().iter_range("", None)] == ["stays"]
    assert again.get(NAMESPACES, "", "team") is None and again.get(CONFIGMAPS, "team", "cfg") is None
    again.close()


# ---------------------------------------------------------------------- damage


def test_torn_trailing_line_is_cut_off_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.jsonl"
    sim = busy_sim(path)
    before, rv = dump(sim), sim.rv
    sim.close()
    complete = path.read_bytes()
    with path.open("ab") as f:  # what a SIGKILL in the middle of the next write leaves
        f.write(b'{"rv":%d,"r":"pods","t":"ADDED","o":{"metadata":{"name":"half' % (rv + 1))

    with caplog.at_level(logging.WARNING, logger="watchcache.sim.journal"):
        again = open_sim(path)
    assert "torn" in caplog.text
    assert dump(again) == before and again.rv == rv
    assert path.read_bytes() == complete  # cut off, so the next record starts on its own line
    again.create(PODS, "default", pod("after"))
    after, rv_after = dump(again), again.rv
    again.close()
    third = open_sim(path)
    assert dump(third) == after and third.rv == rv_after == rv + 1
    third.close()


def test_replay_ignores_a_torn_last_line_it_finds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.jsonl"
    open_sim(path).close()
    journal = Journal.open(path)
    with path.open("ab") as f:  # torn after open (a replay racing a dying writer)
        f.write(b'{"rv":99,"r":"pods","t":"ADD')
    with caplog.at_level(logging.WARNING, logger="watchcache.sim.journal"):
        records = list(journal.replay(ResourceRegistry()))
    assert [rv for _, _, _, rv in records] == [2, 3, 4, 5]
    assert "torn" in caplog.text
    journal.close()


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b'{"rv":4,"r":"pods","t":"ADDED","o":{"metadata":{"name":"x","namespace":"default","resourceVersion":"4"}}}',
        b'{"rv":99,"r":"widgets","t":"ADDED","o":{"metadata":{"name":"x","resourceVersion":"99"}}}',
        b'{"rv":99,"r":"pods","t":"DELETED","o":{"metadata":{"name":"x","namespace":"default","resourceVersion":"99"}}}',
    ],
    ids=["garbage", "rv-not-increasing", "unknown-resource", "delete-of-absent"],
)
def test_a_bad_complete_record_is_an_error_not_skipped(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "state.jsonl"
    open_sim(path).close()
    with path.open("ab") as f:
        f.write(bad + b"\n")
    with pytest.raises(JournalError):
        open_sim(path)
    Journal.open(path).close()  # the failed open released its lock


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = open_sim(path)
    with pytest.raises(JournalError, match="in use"):
        open_sim(path)
    sim.close()
    open_sim(path).close()


def test_writes_after_close_fail_without_applying(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    sim = open_sim(path)
    rv = sim.rv
    sim.close()
    with pytest.raises(ValueError, match="closed"):
        sim.create(PODS, "default", pod())
    assert sim.rv == rv and sim.get(PODS, "default", "web-1") is None


# ---------------------------------------------------------------------- a killed writer

CHURN = textwrap.dedent(
    """
    import sys
    from watchcache.resources import CONFIGMAPS, NAMESPACES, PODS
    from watchcache.sim.cluster import SimCluster

    sim = SimCluster(seed=1, state_file=sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        ns = f"ns-{(i // 20) % 3}"
        if sim.get(NAMESPACES, "", ns) is None:
            sim.create(NAMESPACES, "", {"metadata": {"name": ns}})
            sim.create(CONFIGMAPS, ns, {"metadata": {"name": "cfg"}, "data": {"i": str(i)}})
        name = f"p-{i}"
        sim.create(PODS, ns, {"metadata": {"name": name, "labels": {"i": str(i)}}, "spec": {"nodeName": "n1"}})
        sim.patch(PODS, ns, name, "application/merge-patch+json", b'{"status":{"phase":"Running"}}')
        if i % 3 == 0:
            sim.delete(PODS, ns, name)
        doomed = f"ns-{(i // 20 + 1) % 3}"
        if i % 20 == 19 and sim.get(NAMESPACES, "", doomed) is not None:
            sim.delete(NAMESPACES, "", doomed)
        print(sim.rv, flush=True)  # every commit up to here has been acknowledged
        i += 1
    """
)


def test_a_sigkilled_writer_leaves_a_journal_that_replays_consistently(tmp_path: Path) -> None:
    path = tmp_path / "state.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHURN, str(path)], stdout=subprocess.PIPE, cwd=REPO, env=env)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        # 120 rounds acknowledged (at least 2 commits each), then killed wherever it is.
        acked = [proc.stdout.readline().strip() for _ in range(120)]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    *printed, _ = proc.stdout.read().split(b"\n")
    proc.stdout.close()
    acknowledged = int((acked + printed)[-1])

    data = path.read_bytes()
    *complete, _tail = data.split(b"\n")  # _tail: b"" unless the kill tore the last write
    assert len(complete) > 200, "the writer barely wrote: the test would prove little"
    # The expected state, from the raw lines alone (the object's bytes are sliced, not re-encoded).
    expected: dict[str, dict[str, bytes]] = {}
    for line in complete:
        record = orjson.loads(line)
        meta = record["o"]["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]
        state = expected.setdefault(record["r"], {})
        if record["t"] == "DELETED":
            del state[key]
        else:
            state[key] = line[line.index(b',"o":{') + 5 : -1]
    last_rv = orjson.loads(complete[-1])["rv"]
    assert last_rv >= acknowledged, "a commit the writer had returned from is not in the journal"

    sim = open_sim(path)
    assert sim.restored and sim.rv == last_rv
    assert all(c.rv == last_rv for c in sim.cachers.values())
    got = {r.path_id(): {o.key: b"{" + o.body for o in objs} for r, objs in _objects(sim).items()}
    assert {r: s for r, s in got.items() if s} == {r: s for r, s in expected.items() if s}
    # Consistent: nothing survives in a namespace that was deleted (cascades are whole).
    for resource, objs in _objects(sim).items():
        if resource.namespaced:
            assert all(sim.namespace_exists(o.namespace) for o in objs), resource
    # And the restarted sim keeps counting from there, on a line of its own.
    created = sim.create(PODS, "default", pod("after-restart"))
    assert created.rv == last_rv + 1
    sim.close()
    assert orjson.loads(lines(path)[-1])["rv"] == last_rv + 1
    open_sim(path).close()


def _objects(sim: SimCluster) -> dict:
    return {r: list(c.cache.snapshot().iter_range("", None)) for r, c in sim.cachers.items()}

"""populate() and Churn: realistic contents, a steady write mix around a target count, paced by an injected clock."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from harness.waiting import until
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.object import CachedObject
from watchcache.resources import CONFIGMAPS, NAMESPACES, NODES, PODS, ResourceRegistry, ResourceType
from watchcache.sim.churn import Churn, populate
from watchcache.sim.cluster import INITIAL_NAMESPACES, SimCluster
from watchcache.sim.fixtures import timestamp

WALL = 1_700_000_000.0


def new_sim(seed: int = 1) -> SimCluster:
    return SimCluster(clock=lambda: 100.0, wall_clock=lambda: WALL, seed=seed)


def names(sim: SimCluster, resource: ResourceType) -> list[str]:
    cacher = sim.cachers[resource]
    return [o.key for o in cacher.cache.snapshot().iter_range("", None)]


@pytest.fixture
def sim() -> SimCluster:
    sim = new_sim()
    populate(sim, objects=200, namespaces=5, nodes=4, seed=3)
    return sim


def test_populate_creates_the_requested_objects(sim: SimCluster) -> None:
    assert names(sim, NODES) == ["node-0", "node-1", "node-2", "node-3"]
    assert set(names(sim, NAMESPACES)) == {*INITIAL_NAMESPACES, *(f"ns-{i}" for i in range(5))}
    assert sorted(names(sim, CONFIGMAPS)) == [f"ns-{i}/app-config" for i in range(5)]
    pods = list(sim.cachers[PODS].cache.snapshot().iter_range("", None))
    assert len(pods) == 200
    assert Counter(p.namespace for p in pods) == {f"ns-{i}": 40 for i in range(5)}
    assert Counter(p.fields["spec.nodeName"] for p in pods) == {f"node-{i}": 50 for i in range(4)}
    assert len({p.labels["app"] for p in pods}) > 1
    assert all(p.fields["status.phase"] == "Running" for p in pods)
    assert sim.commits() == len(INITIAL_NAMESPACES) + 4 + 5 + 5 + 200


def test_populate_is_deterministic_given_the_seed() -> None:
    a, b, c = new_sim(), new_sim(), new_sim()
    for cluster, seed in ((a, 3), (b, 3), (c, 4)):
        populate(cluster, objects=50, namespaces=2, nodes=2, seed=seed)
    assert names(a, PODS) == names(b, PODS)
    assert names(a, PODS) != names(c, PODS)
    pa, pb = (x.cachers[PODS].cache.snapshot().iter_range("", None) for x in (a, b))
    assert [p.body for p in pa] == [p.body for p in pb]  # same sim seed too: uids match


def test_populate_with_only_pods_served() -> None:
    cluster = SimCluster(ResourceRegistry((PODS,)), wall_clock=lambda: WALL)
    populate(cluster, objects=10, namespaces=2, nodes=0)
    assert len(cluster.cachers[PODS].cache) == 10


def test_step_commits_n_writes_mostly_updates(sim: SimCluster) -> None:
    churn = Churn(sim, rate=100, seed=5)
    kinds: Counter[str] = Counter()
    sim.subscribe(lambda r, changes, rv: kinds.update(t for t, _ in changes))
    before = sim.commits()
    churn.step(1000)
    assert sim.commits() - before >= 1000
    assert churn.writes == 1000
    assert kinds[MODIFIED] > 700 and kinds[ADDED] > 20 and kinds[DELETED] > 20
    assert abs(len(sim.cachers[PODS].cache) - churn.target) <= 1


def test_updates_change_labels_annotations_and_status(sim: SimCluster) -> None:
    churn = Churn(sim, rate=100, seed=5)
    modified: list[CachedObject] = []
    sim.subscribe(lambda r, changes, rv: modified.extend(o for t, o in changes if t == MODIFIED))
    churn.step(300)
    changed: Counter[str] = Counter()
    for obj in modified:
        body = obj.decode()
        changed["label"] += "version" in body["metadata"]["labels"]
        changed["annotation"] += "sim.watchcache.io/heartbeat" in body["metadata"].get("annotations", {})
        changed["restart"] += any(
            s.get("lastState", {}).get("terminated", {}).get("reason") == "Error"
            for s in body["status"]["containerStatuses"]
        )
    assert min(changed.values()) > 0 and len(changed) == 3


def test_a_kubelets_times_are_the_sims_wall_clock_not_a_fixed_date() -> None:
    """kubectl shows RESTARTS "2 (7s ago)" beside AGE 7s: nothing a kubelet recorded predates the pod."""
    clock = [WALL]
    cluster = SimCluster(clock=lambda: 100.0, wall_clock=lambda: clock[0], seed=1)
    populate(cluster, objects=40, namespaces=2, nodes=2, seed=3)
    at_start = timestamp(WALL)
    pods = [o.decode() for o in cluster.cachers[PODS].cache.snapshot().iter_range("", None)]
    nodes = [o.decode() for o in cluster.cachers[NODES].cache.snapshot().iter_range("", None)]
    statuses = [s for p in pods for s in p["status"]["containerStatuses"]]
    restarted = [s for s in statuses if s["restartCount"]]
    assert restarted, "no pod has a restart to show"
    times = {p["metadata"]["creationTimestamp"] for p in pods}
    times |= {p["status"]["startTime"] for p in pods}
    times |= {c["lastTransitionTime"] for o in pods + nodes for c in o["status"]["conditions"]}
    times |= {s["state"]["running"]["startedAt"] for s in statuses}
    times |= {s["lastState"]["terminated"][k] for s in restarted for k in ("startedAt", "finishedAt")}
    assert times == {at_start}

    clock[0] = WALL + 3600  # pods the churn creates later: their own creation time
    churn = Churn(cluster, rate=100, seed=2)
    created: list[CachedObject] = []
    cluster.subscribe(lambda r, changes, rv: created.extend(o for t, o in changes if t == ADDED))
    churn.step(300)
    assert created
    for obj in created:
        body = obj.decode()
        assert body["status"]["startTime"] == body["metadata"]["creationTimestamp"] == timestamp(WALL + 3600)


def test_pod_count_stays_near_target_over_a_long_run(sim: SimCluster) -> None:
    churn = Churn(sim, rate=100, seed=9)
    counts = []
    for _ in range(50):
        churn.step(100)
        counts.append(len(sim.cachers[PODS].cache))
    assert churn.target == 200
    assert min(counts) >= 199 and max(counts) <= 201


def test_churn_from_an_empty_cluster_stays_small() -> None:
    cluster = new_sim()
    churn = Churn(cluster, rate=10, seed=1)
    assert churn.target == 0
    churn.step(100)
    assert churn.writes == 100 and len(cluster.cachers[PODS].cache) <= 1


def test_churn_survives_pods_deleted_behind_its_back(sim: SimCluster) -> None:
    churn = Churn(sim, rate=100, seed=2)
    sim.delete(NAMESPACES, "", "ns-0")
    sim.delete(NAMESPACES, "", "ns-1")
    before = sim.commits()
    churn.step(500)
    assert sim.commits() - before == 500
    assert all(not k.startswith(("ns-0/", "ns-1/")) for k in names(sim, PODS))


def test_churn_is_deterministic_given_seeds() -> None:
    def run(seed: int) -> list[str]:
        cluster = new_sim()
        populate(cluster, objects=50, namespaces=2, nodes=2)
        Churn(cluster, rate=10, seed=seed).step(200)
        return names(cluster, PODS)

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_negative_rate_is_refused(sim: SimCluster) -> None:
    with pytest.raises(ValueError):
        Churn(sim, rate=-1)


class Stop(Exception):
    pass


class FakeTime:
    """A clock that only moves when ``run`` sleeps; ``jumps`` lets a test make a tick late."""

    def __init__(self, ticks: int, jumps: dict[int, float] | None = None) -> None:
        self.now = 50.0
        self.ticks = ticks
        self.jumps = jumps or {}
        self.slept = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept += 1
        self.now += self.jumps.get(self.slept, seconds)
        if self.slept >= self.ticks:
            raise Stop
        await asyncio.sleep(0)


def run_churn(churn: Churn) -> None:
    with pytest.raises(Stop):
        asyncio.run(churn.run())


def test_run_writes_at_the_rate_by_the_clock(sim: SimCluster) -> None:
    fake = FakeTime(ticks=101)  # the last sleep stops the run before its writes
    churn = Churn(sim, rate=1000, seed=1, clock=fake.clock, sleep=fake.sleep)
    before = sim.commits()
    run_churn(churn)
    # 100 ticks of 10 ms at 1000/s; float rounding may leave one write for the next tick.
    assert 999 <= churn.writes <= 1000
    assert sim.commits() - before == churn.writes
    assert churn.skipped == 0


def test_run_catches_up_after_a_late_tick(sim: SimCluster) -> None:
    fake = FakeTime(ticks=3, jumps={1: 0.5})
    churn = Churn(sim, rate=100, seed=1, clock=fake.clock, sleep=fake.sleep)
    run_churn(churn)
    assert 50 <= churn.writes <= 51  # 0.5 s late → the 50 writes due, then one 10 ms tick's worth
    assert churn.skipped == 0


def test_run_drops_a_backlog_beyond_one_second(sim: SimCluster) -> None:
    fake = FakeTime(ticks=2, jumps={1: 5.0})
    churn = Churn(sim, rate=100, seed=1, clock=fake.clock, sleep=fake.sleep)
    run_churn(churn)
    assert churn.writes == 100 and churn.skipped == 400


def test_run_is_cancellable(sim: SimCluster) -> None:
    async def main() -> int:
        churn = Churn(sim, rate=500, seed=1)
        task = asyncio.create_task(churn.run())
        await until(lambda: churn.writes > 0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return churn.writes

    assert asyncio.run(main()) > 0

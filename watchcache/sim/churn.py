"""Populating the sim and churning it at a steady write rate, like a busy cluster's controllers.

The proxy's costs are driven by the event stream (fan-out, history memory, resumes),
so the load generator writes what real clusters mostly write: pod status and
metadata updates, with a trickle of creates and deletes that keeps the pod count
where it started. Everything is drawn from one seeded ``random.Random`` so a run can
be replayed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from watchcache.apierrors import StatusError
from watchcache.resources import ResourceType
from watchcache.sim.cluster import SimCluster
from watchcache.sim.fixtures import (
    APPS,
    make_configmap,
    make_namespace,
    make_node,
    make_pod,
    pod_template_hash,
    random_suffix,
    timestamp,
)

TICK = 0.01
UPDATE_SHARE = 0.8
_MAX_ATTEMPTS = 20


def _type(cluster: SimCluster, resource: str) -> ResourceType:
    found = cluster.registry.get("", "v1", resource)
    if found is None:
        raise KeyError(f"the sim does not serve {resource}")
    return found


def populate(cluster: SimCluster, *, objects: int, namespaces: int, nodes: int = 10, seed: int = 0) -> None:
    """Nodes ``node-0…``, namespaces ``ns-0…`` (one configmap each) and ``objects`` pods spread over both.

    Pods are named like a Deployment's (``<app>-<rs hash>-<suffix>``) and grouped by app
    within a namespace, so label selectors match realistic fractions of a list.
    """
    rng = random.Random(seed)
    started = timestamp(cluster.wall_clock())  # what a kubelet records, as of the sim's start
    pods = _type(cluster, "pods")
    node_type = cluster.registry.get("", "v1", "nodes")
    ns_type = cluster.registry.get("", "v1", "namespaces")
    cm_type = cluster.registry.get("", "v1", "configmaps")
    node_names = [f"node-{i}" for i in range(nodes)]
    if node_type is not None:
        for name in node_names:
            if cluster.get(node_type, "", name) is None:
                cluster.create(node_type, "", make_node(name, rng, started=started))
    ns_names = [f"ns-{i}" for i in range(namespaces)] or ["default"]
    for ns in ns_names:
        if ns_type is not None and cluster.get(ns_type, "", ns) is None:
            cluster.create(ns_type, "", make_namespace(ns))
        if cm_type is not None and cluster.get(cm_type, ns, "app-config") is None:
            cluster.create(cm_type, ns, make_configmap("app-config", ns, rng))
    for i in range(objects):
        ns = ns_names[i % len(ns_names)]
        app = APPS[(i // len(ns_names)) % len(APPS)]
        while True:
            name = f"{app}-{pod_template_hash(app)}-{random_suffix(rng)}"
            if cluster.get(pods, ns, name) is None:
                break
        node = node_names[i % len(node_names)] if node_names else ""
        cluster.create(pods, ns, make_pod(name, ns, node, rng, app=app, started=started))


class Churn:
    """Writes to pods at ``rate`` per second: mostly updates, plus creates and deletes around a target count.

    The target is the pod count when the churn starts. Pods it did not create are
    churned too; pods deleted behind its back (a namespace deleted over HTTP) are
    skipped when it next picks them.
    """

    def __init__(
        self,
        cluster: SimCluster,
        rate: float,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        self.cluster = cluster
        self.rate = rate
        self.pods = _type(cluster, "pods")
        self._cacher = cluster.cacher(self.pods)
        self._rng = random.Random(seed)
        self._clock = clock
        self._sleep = sleep
        # (namespace, name) of live pods, as a list for O(1) random choice plus its index.
        self._keys: list[tuple[str, str]] = []
        self._index: dict[tuple[str, str], int] = {}
        for obj in self._cacher.cache.snapshot().iter_range("", None):
            self._track((obj.namespace, obj.name))
        self.target = len(self._keys)
        nodes = cluster.registry.get("", "v1", "nodes")
        self._nodes = [o.name for o in cluster.cachers[nodes].cache.snapshot().iter_range("", None)] if nodes else []
        self._nodes = self._nodes or ["node-0"]
        self.writes = 0
        self.skipped = 0  # writes dropped because the loop fell more than a second behind

    # ------------------------------------------------------------------ one batch

    def step(self, n: int) -> None:
        """Commit ``n`` pod writes (retrying any that lost a race with another writer)."""
        for _ in range(n):
            for _attempt in range(_MAX_ATTEMPTS):
                try:
                    self._one()
                except StatusError as err:
                    if err.code not in (404, 409):
                        raise
                    continue
                self.writes += 1
                break

    def _one(self) -> None:
        count = len(self._cacher.cache)
        if self._keys and self._rng.random() < UPDATE_SHARE:
            self._update()
        elif count < self.target or not self._keys or (count == self.target and self._rng.random() < 0.5):
            self._create()
        else:
            self._delete()

    def _pick(self) -> tuple[str, str]:
        return self._keys[self._rng.randrange(len(self._keys))]

    def _update(self) -> None:
        key = self._pick()
        current = self.cluster.get(self.pods, *key)
        if current is None:
            self._untrack(key)
            raise StatusError(404, "NotFound", "gone")
        obj = current.decode()
        meta = obj["metadata"]
        choice = self._rng.random()
        statuses = (obj.get("status") or {}).get("containerStatuses") or []
        if choice < 0.3 and statuses:
            # A container restart: the status write kubelets make.
            container = self._rng.choice(statuses)
            now = _now(self.cluster)
            container["restartCount"] = int(container.get("restartCount", 0)) + 1
            container["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now}}
            container["state"] = {"running": {"startedAt": now}}
        elif choice < 0.5:
            labels = meta.setdefault("labels", {})
            labels["version"] = f"v{self._rng.randint(1, 5)}-{self.cluster.rv}"
        else:
            annotations = meta.setdefault("annotations", {})
            annotations["sim.watchcache.io/heartbeat"] = str(self.cluster.rv)
        self.cluster.update(self.pods, key[0], key[1], obj)

    def _create(self) -> None:
        namespace = self._pick()[0] if self._keys else "default"
        app = self._rng.choice(APPS)
        name = f"{app}-{pod_template_hash(app)}-{random_suffix(self._rng)}"
        node = self._rng.choice(self._nodes)
        try:
            body = make_pod(name, namespace, node, self._rng, app=app, started=_now(self.cluster))
            self.cluster.create(self.pods, namespace, body)
        except StatusError as err:
            if err.code == 404 and self._keys:  # the namespace is gone: forget its pods
                for key in [k for k in self._keys if k[0] == namespace]:
                    self._untrack(key)
            raise
        self._track((namespace, name))

    def _delete(self) -> None:
        key = self._pick()
        self._untrack(key)
        self.cluster.delete(self.pods, *key)

    def _track(self, key: tuple[str, str]) -> None:
        if key not in self._index:
            self._index[key] = len(self._keys)
            self._keys.append(key)

    def _untrack(self, key: tuple[str, str]) -> None:
        i = self._index.pop(key, None)
        if i is None:
            return
        last = self._keys.pop()
        if last != key:
            self._keys[i] = last
            self._index[last] = i

    # ------------------------------------------------------------------ pacing

    async def run(self) -> None:
        """Write at ``rate``/s until cancelled, in batches every ~10 ms, catching up when a tick runs late.

        A backlog beyond one second of writes is dropped (counted in ``skipped``) rather
        than replayed: if the process cannot sustain the rate, it should not block the
        loop for ever-longer bursts.
        """
        start = self._clock()
        done = 0
        while True:
            due = int((self._clock() - start) * self.rate) - done
            limit = max(1, int(self.rate))
            if due > limit:
                self.skipped += due - limit
                done += due - limit
                due = limit
            if due > 0:
                self.step(due)
                done += due
            await self._sleep(TICK)


def _now(cluster: SimCluster) -> str:
    return timestamp(cluster.wall_clock())

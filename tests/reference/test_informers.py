"""client-go-style informers through watchcache and against the apiserver, while a writer churns.

Every flavor of ``informers.py`` (typed protobuf-preferred, typed JSON, metadata, WatchList typed
and metadata) for ConfigMaps and Pods, each run against the proxy (TLS, delegated authentication,
default workers) AND against the apiserver, while writers create, update and delete a few thousand
objects. After the churn every store must be the apiserver's state exactly (uid and resourceVersion
of every object), with no decode error, one list each (no relist: no 410, no decode error, no very
short watch), and their watches resumed many times from the last resourceVersion seen.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.kube.kit import Api, ApiError, KubeEnv, Serving, drop_namespace, needs_kube, start_proxy, wait_for
from harness.metaclient import Target
from harness.processes import Proc
from harness.reflector import FLAVORS, Informer

pytestmark = [pytest.mark.reference, needs_kube]

NS = f"reference-informers-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
KINDS = {"configmaps": "ConfigMap", "pods": "Pod"}
INITIAL = {"configmaps": 600, "pods": 150}  # more ConfigMaps than a page (500)
CHURN = 3000  # writes
CHURN_SECONDS = 15.0
WRITERS = 4


@dataclass
class Env:
    kube: KubeEnv
    api: Api
    proxy: Proc
    serving: Serving

    def target(self, where: str) -> Target:
        if where == "proxy":
            return Target(self.proxy.url, self.kube.token, str(self.serving.ca.crt))
        return Target(self.kube.url, self.kube.token, self.kube.ca)


def _obj(resource: str, name: str, i: int) -> dict:
    meta = {"name": name, "labels": {"watchcache-reference": "informers", "i": str(i % 7)}}
    if resource == "pods":
        return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": f"registry.example/x:{i}"}]}}
    return {"metadata": meta, "data": {"i": str(i)}}


def _clean(api: Api) -> None:
    drop_namespace(api, NS, (*KINDS, "serviceaccounts"))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    _clean(api)
    api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    try:  # admission wants it; with --control-plane the kit's controller manager may make it meanwhile
        api.create(f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "default"}})
    except ApiError as e:
        if e.status != 409:
            raise
    with ThreadPoolExecutor(WRITERS) as pool:
        jobs = [(r, i) for r, n in INITIAL.items() for i in range(n)]
        list(pool.map(lambda j: api.create(f"/api/v1/namespaces/{NS}/{j[0]}", _obj(j[0], f"init-{j[1]}", j[1])), jobs))
    serving = Serving.make(Path(tmp_path_factory.mktemp("informers")))
    proxy = start_proxy(kube, serving, resources="configmaps,pods")
    try:
        yield Env(kube, api, proxy, serving)
    finally:
        proxy.stop()
        _clean(api)
        api.close()


def _churn(api: Api, writes: int, seconds: float) -> None:
    """``writes`` creates, updates and deletes of ConfigMaps and Pods by ``WRITERS`` writers, spread over
    at least ``seconds`` (so that the informers' watches end and resume during it). Each writer owns
    its names, so every write succeeds and is an event."""

    def writer(w: int) -> None:
        rnd = random.Random(w)
        alive: dict[str, list[str]] = {r: [] for r in KINDS}
        started = time.monotonic()
        share = writes // WRITERS
        for n in range(share):
            resource = "configmaps" if rnd.random() < 0.7 else "pods"
            base = f"/api/v1/namespaces/{NS}/{resource}"
            names = alive[resource]
            op = rnd.random()
            if not names or op < 0.4:
                name = f"churn-{w}-{n}"
                api.create(base, _obj(resource, name, n))
                names.append(name)
            elif op < 0.8:
                api.merge_patch(f"{base}/{rnd.choice(names)}", {"metadata": {"annotations": {"n": str(n)}}})
            else:
                api.delete(f"{base}/{names.pop(rnd.randrange(len(names)))}", gracePeriodSeconds=0, missing_ok=False)
            ahead = started + seconds * (n + 1) / share - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, range(WRITERS)))


def _truth(api: Api, resource: str) -> dict[str, tuple[str, str]]:
    items = api.get(f"/api/v1/namespaces/{NS}/{resource}")["items"]
    return {f"{NS}/{i['metadata']['name']}": (i["metadata"]["uid"], i["metadata"]["resourceVersion"]) for i in items}


@pytest.mark.timeout(600)
def test_informers_through_the_proxy_match_the_apiserver_after_churn(env: Env) -> None:
    informers = [
        Informer(env.target(where), f"/api/v1/namespaces/{NS}/{resource}", kind, "v1", flavor)
        for where in ("proxy", "apiserver")
        for resource, kind in KINDS.items()
        for flavor in FLAVORS.values()
    ]
    threads = [threading.Thread(target=i.run, daemon=True) for i in informers]
    for t in threads:
        t.start()
    try:
        for inf in informers:
            assert inf.synced.wait(60), inf
        _churn(env.api, CHURN, CHURN_SECONDS)
        for resource in KINDS:
            env.api.create(f"/api/v1/namespaces/{NS}/{resource}", _obj(resource, "final", 0))
        # Events arrive in order: once the last write is in a store, every earlier one is.
        for inf in informers:
            wait_for(lambda inf=inf: f"{NS}/final" in inf.store, 60, str(inf))
        # But the kit's scheduler writes each pod's status (PodScheduled) on its own time, under the
        # churn seconds after the pod's creation, so after the last write here too (this test failed
        # once so: three late pods a status update behind in one store, found in session 48). Every
        # store must come to the apiserver's state, read again until it does; a lost event never
        # comes, and the assertions below then name the store it is missing from.
        seen: dict[str, object] = {}

        def converged() -> bool:
            truth = seen["truth"] = {r: _truth(env.api, r) for r in KINDS}
            versions = seen["versions"] = {id(inf): inf.versions() for inf in informers}
            return all(versions[id(inf)] == truth[inf.path.rsplit("/", 1)[1]] for inf in informers)

        with contextlib.suppress(AssertionError):
            wait_for(converged, 60, "every store at the apiserver's state", interval=0.5)
    finally:
        for inf in informers:
            inf.halt()
        for t in threads:
            t.join(30)
    print("\n" + "\n".join(str(i) for i in informers))
    truth, versions = seen["truth"], seen["versions"]
    assert isinstance(truth, dict) and isinstance(versions, dict)
    for inf in informers:
        resource = inf.path.rsplit("/", 1)[1]
        assert inf.decode_errors == [], inf
        assert inf.errors == [], inf
        assert (inf.lists, inf.expired) == (1, 0), inf  # no relist, no 410
        assert inf.watches > 2, inf  # resumed from its resourceVersion, several times
        assert versions[id(inf)] == truth[resource], inf

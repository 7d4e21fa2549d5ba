"""Property test: grouped, batched fan-out against a per-watcher reference model.

The dispatcher chooses frames once per group of equal predicates and hands each watcher
a batch as one joined bytes object. Whatever the watchers (predicates, when they join
and leave) and the batches, every watcher must receive exactly what kube's per-watcher
rules give for each event after its start: ADDED on entering the selection, MODIFIED
inside it, DELETED on leaving it or on deletion, in rv order, nothing twice.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.doubles import NoLagSink
from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher

NAMESPACES = ["a", "b"]
NAMES = ["p0", "p1", "p2"]
NODES = ["", "n1", "n2"]
APPS = [None, "web", "db"]

# (namespace, label selector, field selector): trigger-indexed, namespace-indexed and cluster-wide.
predicates = st.tuples(
    st.sampled_from([None, *NAMESPACES]),
    st.sampled_from(["", "app=web", "app!=web"]),
    st.sampled_from(["", "spec.nodeName=n1", "spec.nodeName=n2", "metadata.name=p1"]),
)
# (ns, name, delete?, node, app)
change = st.tuples(
    st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans(), st.sampled_from(NODES), st.sampled_from(APPS)
)
step = st.one_of(
    st.tuples(st.just("batch"), st.lists(change, min_size=1, max_size=5)),
    st.tuples(st.just("join"), predicates),
    st.tuples(st.just("leave"), st.integers(0, 1000)),
)


def model_matches(pred: tuple[str | None, str, str], key: str, state: dict[str, Any]) -> bool:
    ns, labels, fields = pred
    if ns is not None and not key.startswith(ns + "/"):
        return False
    app = state["app"]
    if labels == "app=web" and app != "web":
        return False
    if labels == "app!=web" and app == "web":
        return False
    if fields.startswith("spec.nodeName=") and state["node"] != fields.split("=")[1]:
        return False
    return not (fields == "metadata.name=p1" and key.split("/")[1] != "p1")


def model_event(pred: tuple[str | None, str, str], key: str, before: dict | None, after: dict | None) -> str | None:
    was = before is not None and model_matches(pred, key, before)
    now = after is not None and model_matches(pred, key, after)
    if now:
        return MODIFIED if was else ADDED
    return DELETED if was else None


def received(w: Watcher) -> list[tuple[str, str, int]]:
    frames, _ = w.take()
    out = []
    for line in b"".join(frames).splitlines():
        ev = orjson.loads(line)
        meta = ev["object"]["metadata"]
        out.append((ev["type"], f"{meta['namespace']}/{meta['name']}", int(meta["resourceVersion"])))
    return out


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=30), initial=st.lists(predicates, max_size=4))
def test_every_watcher_gets_exactly_its_per_watcher_events(steps, initial):
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([], 1)
    d = Dispatcher(PODS)
    state: dict[str, dict[str, Any]] = {}
    rv = 1
    # Every watcher ever registered: (watcher, predicate, expected events, events received).
    live: list[tuple[Watcher, tuple, list, list]] = []
    done: list[tuple[Watcher, tuple, list, list]] = []

    def join(pred: tuple) -> None:
        ns, labels, fields = pred
        w = Watcher(PODS, SelectionPredicate.parse(PODS, ns, labels, fields), cache.rv, NoLagSink(), can_lag=False)
        d.add(w, 0.0)
        live.append((w, pred, [], []))

    for pred in initial:
        join(pred)
    for kind, arg in steps:
        if kind == "join":
            join(arg)
        elif kind == "leave":
            if live:
                entry = live.pop(arg % len(live))
                d.remove(entry[0])
                entry[3].extend(received(entry[0]))
                done.append(entry)
        else:
            changes = []
            for ns, name, delete, node, app in arg:
                key = f"{ns}/{name}"
                before = state.get(key)
                if delete and before is None:
                    continue
                rv += 1
                labels = {"app": app} if app else {}
                after = None if delete else {"node": node, "app": app}
                if delete:
                    changes.append((DELETED, pod(name, ns, rv, labels=labels, node=node)))
                    del state[key]
                else:
                    changes.append((MODIFIED if before else ADDED, pod(name, ns, rv, labels=labels, node=node)))
                    state[key] = after  # type: ignore[assignment]
                for _, pred, expected, _ in live:
                    t = model_event(pred, key, before, after)
                    if t is not None:
                        expected.append((t, key, rv))
            if changes:
                d.dispatch(cache.apply(changes))
            # Read some of what is pending between batches, as a client would.
            for w, _, _, got in live[::2]:
                got.extend(received(w))
    for w, _, _, got in live:
        got.extend(received(w))
    for w, pred, expected, got in live + done:
        assert got == expected, (pred, w.start_rv)

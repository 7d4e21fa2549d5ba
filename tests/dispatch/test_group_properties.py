"""Property test: groups of events sharing an rv, split across batches, against informer-like clients.

An upstream that is itself a watch cache sends groups (several events at one rv), and a
network read may end inside one, so the cacher sees the group in two batches. Clients
start (list, then watch from the list's rv), read, get bookmarks, disconnect and resume
from the last rv they saw, at any point — also between the two batches of a group. Each
client ends with exactly the upstream's state for its selection: nothing lost, nothing
twice, rvs never going backwards, no event at or below a bookmark it got — or it was told
410 (a watch ended with an ERROR event, or a resume refused) and relisted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.doubles import NoLagSink
from tests.support.factories import pod
from watchcache.cache.events import DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher

NAMESPACES = ["a", "b"]
NAMES = ["p0", "p1", "p2"]
SELECTIONS = [(None, ""), ("a", ""), ("b", ""), (None, "metadata.name=p1")]

change = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES), st.booleans())
step = st.one_of(
    # a group at the next rv (distinct keys), and where the read splits it (0: not split)
    st.tuples(
        st.just("group"),
        st.tuples(st.lists(change, min_size=1, max_size=4, unique_by=lambda c: c[:2]), st.integers(0, 3)),
    ),
    st.tuples(st.just("client"), st.integers(0, len(SELECTIONS) - 1)),
    st.tuples(st.just("read"), st.integers(0, 1000)),
    st.tuples(st.just("bookmark"), st.just(0)),
    st.tuples(st.just("reconnect"), st.integers(0, 1000)),
)


@dataclass
class Client:
    selection: tuple[str | None, str]
    state: dict[str, int] = field(default_factory=dict)
    rv: int = 0  # the newest rv seen: list, event or bookmark
    bookmark: int = 0  # the newest bookmark's rv: nothing at or below it may follow
    watcher: Watcher | None = None
    relists: int = 0

    @property
    def predicate(self) -> SelectionPredicate:
        ns, fields = self.selection
        return SelectionPredicate.parse(PODS, ns, "", fields)


def list_and_watch(cacher: Cacher, client: Client) -> None:
    """LIST (the snapshot), then WATCH from its rv: set up in one synchronous step, as serve_watch."""
    predicate = client.predicate
    snapshot = cacher.cache.snapshot()
    client.state = {o.key: o.rv for o in snapshot.iter_range("", None) if predicate.matches(o)}
    client.rv = client.bookmark = snapshot.rv
    client.watcher = Watcher(PODS, predicate, snapshot.rv, NoLagSink(), allow_bookmarks=True)
    cacher.add_watcher(client.watcher)


def resume(cacher: Cacher, client: Client) -> None:
    """WATCH from the newest rv seen (the cacher's own start section); on 410, relist."""
    plan = WatchPlan(Mode.EXACT, client.rv, initial_events=False, initial_events_end_bookmark=False)
    try:
        client.watcher = cacher.start_watch(WatchRequest(client.predicate, plan, allow_bookmarks=True), NoLagSink())
    except ResourceVersionTooOld:  # 410
        client.relists += 1
        list_and_watch(cacher, client)


def read(cacher: Cacher, client: Client) -> None:
    watcher = client.watcher
    assert watcher is not None
    frames, _ = watcher.take()
    for line in b"".join(frames).splitlines():
        ev = orjson.loads(line)
        obj = ev["object"]
        if ev["type"] == "ERROR":
            assert obj["code"] == 410, obj
            cacher.remove_watcher(watcher)
            client.relists += 1
            list_and_watch(cacher, client)
            return
        rv = int(obj["metadata"]["resourceVersion"])
        assert rv >= client.rv, f"rv went back: {rv} after {client.rv}"
        client.rv = rv
        if ev["type"] == "BOOKMARK":
            client.bookmark = rv
            continue
        assert rv > client.bookmark, f"{ev['type']} at {rv} after a bookmark at {client.bookmark}"
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if ev["type"] == "DELETED":
            assert key in client.state, f"DELETED {key} the client does not hold"
            del client.state[key]
        else:
            assert (ev["type"] == "ADDED") == (key not in client.state), f"{ev['type']} {key}"
            client.state[key] = rv
    assert not watcher.closed


def disconnect(cacher: Cacher, client: Client) -> None:
    read(cacher, client)  # what reached the client before the connection broke
    assert client.watcher is not None
    client.watcher.close("client_gone")
    cacher.remove_watcher(client.watcher)


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step, max_size=40))
def test_clients_end_with_the_upstream_state_whatever_the_splits_resumes_and_bookmarks(steps):
    cacher = Cacher(PODS)
    cacher.replace([pod("p0", "a", 1), pod("p1", "b", 2)], 5)
    upstream = {"a/p0": 1, "b/p1": 2}
    rv = 5
    clients: list[Client] = []
    for kind, arg in steps:
        if kind == "group":
            changes, split = arg
            rv += 1
            batch = []
            for ns, name, delete in changes:
                key = f"{ns}/{name}"
                if delete and key in upstream:
                    batch.append((DELETED, pod(name, ns, rv)))
                    del upstream[key]
                else:
                    batch.append((MODIFIED, pod(name, ns, rv)))
                    upstream[key] = rv
            split = split if 0 < split < len(batch) else len(batch)
            cacher.apply(batch[:split])
            # Between the two reads anything may happen: here, a client starts.
            if split < len(batch):
                if clients:
                    for c in clients[::2]:
                        read(cacher, c)
                extra = Client(SELECTIONS[rv % len(SELECTIONS)])
                list_and_watch(cacher, extra)
                clients.append(extra)
                for w in list(cacher.dispatcher.watchers()):
                    w.bookmark(cacher.rv)
                # ... and one loses its connection, to resume once the rest has arrived.
                gone = clients[rv % len(clients)]
                disconnect(cacher, gone)
                cacher.apply(batch[split:])
                resume(cacher, gone)
        elif kind == "client":
            c = Client(SELECTIONS[arg])
            list_and_watch(cacher, c)
            clients.append(c)
        elif kind == "read" and clients:
            read(cacher, clients[arg % len(clients)])
        elif kind == "bookmark":
            for w in list(cacher.dispatcher.watchers()):
                w.bookmark(cacher.rv)
        elif kind == "reconnect" and clients:
            c = clients[arg % len(clients)]
            disconnect(cacher, c)
            resume(cacher, c)
    for c in clients:
        read(cacher, c)
        predicate = c.predicate
        expected = {k: v for k, v in upstream.items() if predicate.matches(pod(k.split("/")[1], k.split("/")[0]))}
        assert c.state == expected, (c.selection, c.relists)

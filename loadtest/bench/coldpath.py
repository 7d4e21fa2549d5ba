"""The proxy's per-event path in one process, with warm caches and with the CPU caches flushed between events.

Why: in ``loadtest.bench.kubelets`` a pod event that one kubelet watch selects costs the proxy
~400–650 µs of CPU at 100 writes/s on the 2-core machine, while the same Python path costs
well under 100 µs in a loop. At such rates every event is its own wakeup, and between two events
the machine runs the upstream, the writer and the clients: the proxy's code and data are no
longer in the CPU caches. This bench reproduces that regime in isolation: it feeds the real
reflector (``Reflector._apply``: parse, encode, store, dispatch through the trigger index to one of
``--watchers`` node watchers) one pod event line at a time, takes the frame a flush would write,
and between two events (uncounted) writes ``--flush-mb`` MB of memory, as another process would
evict the caches. TLS, sockets and the event loop are left out: what remains is the Python work.

Run: ``.venv/bin/python -m loadtest.bench.coldpath`` (prints µs of CPU per event for each
``--flush-mb``; figures in docs/lab/performance-notebook.md, "Kubelet-shaped scale").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import orjson

from harness.doubles import NullSink
from watchcache.cache.predicate import SelectionPredicate
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.sim import fixtures
from watchcache.upstream.reflector import Reflector
from watchcache.watchers.watcher import Watcher


def _pod(i: int, nodes: int, rng: random.Random) -> dict[str, object]:
    node = f"node-{i % nodes:05d}"
    pod = fixtures.make_pod(f"{node}-pod-{i}", "bench", node, rng)
    pod.pop("kind", None)
    pod.pop("apiVersion", None)
    return {"kind": "Pod", "apiVersion": "v1", **pod}


async def measure(watchers: int, pods: int, events: int, flush_mb: list[int]) -> dict[str, float]:
    rng = random.Random(1)
    objects = [_pod(i, watchers, rng) for i in range(pods)]
    rv = 10
    for obj in objects:
        obj["metadata"]["resourceVersion"] = str(rv)  # type: ignore[index]
    cacher = Cacher(PODS)
    reflector = Reflector(client=None, cacher=cacher)  # type: ignore[arg-type]
    reflector._apply([orjson.dumps({"type": "ADDED", "object": o}) for o in objects])
    by_node: dict[str, Watcher] = {}
    for k in range(watchers):
        node = f"node-{k:05d}"
        predicate = SelectionPredicate.parse(PODS, None, "", f"spec.nodeName={node}")
        w = Watcher(PODS, predicate, cacher.rv, NullSink(), max_pending_bytes=1 << 30)
        cacher.dispatcher.add(w, 0.0)
        by_node[node] = w
    out: dict[str, float] = {}
    for mb in flush_mb:
        lines, nodes = [], []
        for j in range(events):
            obj = objects[rng.randrange(pods)]
            rv += 1
            obj["metadata"]["resourceVersion"] = str(rv)  # type: ignore[index]
            obj["metadata"]["annotations"]["bench/written-at"] = str(j)  # type: ignore[index]
            lines.append(orjson.dumps({"type": "MODIFIED", "object": obj}))
            nodes.append(obj["spec"]["nodeName"])  # type: ignore[index]
        evict = bytearray(mb << 20)
        spent = 0.0
        delivered = 0
        for line, node in zip(lines, nodes, strict=True):
            if mb:
                evict[::64] = b"\x01" * len(range(0, len(evict), 64))  # another process's work
            t0 = time.process_time()
            reflector._apply([line])
            frames, n = by_node[node].take(1 << 20)
            b"".join(frames)
            spent += time.process_time() - t0
            delivered += n
        if delivered != events:  # each event reached its node's watcher, once
            raise AssertionError(f"{delivered} of {events} events delivered")
        out[f"flush {mb} MB"] = round(spent / events * 1e6, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watchers", type=int, default=1000, help="node watchers (kubelets' pod watches)")
    p.add_argument("--pods", type=int, default=10000)
    p.add_argument("--events", type=int, default=3000, help="events per point")
    p.add_argument("--flush-mb", default="0,4,16,64", help="MB written between two events (0: warm)")
    args = p.parse_args()
    points = [int(x) for x in args.flush_mb.split(",")]
    result = asyncio.run(measure(args.watchers, args.pods, args.events, points))
    print(json.dumps({"bench": "coldpath", "us_cpu_per_event": result, "args": vars(args)}))


if __name__ == "__main__":
    main()

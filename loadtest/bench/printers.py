"""The Table path in process: deriving a pod's row once, writing rows per request, and what rows cost in memory.

On ``--pods`` simulated pods (``watchcache/sim/fixtures.py``, ~3.2 KB each, as the demo's):

- ``derive``: the first Table that reads a pod parses it once, prints it (``printers/kube.py``) and
  encodes its cells (µs per pod; it also derives the pod's PartialObjectMetadata from the same parse);
- ``write``: a LIST page of 500 pods as kubectl asks for it (``includeObject`` Metadata, the default;
  None; Object): the rows' pieces, the ages and the row objects, handed to the transport (µs per row,
  and per 500-row page), best of ``--repeat``;
- ``memory``: bytes a derived row adds per pod (``tracemalloc``), next to the pod's own JSON.

No kit, no sockets. Run: ``.venv/bin/python -m loadtest.bench.printers``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from typing import Any

from watchcache.cache.object import encode_object
from watchcache.printers.kube import POD
from watchcache.printers.row import row_of
from watchcache.printers.table import TableEncoding
from watchcache.resources import PODS
from watchcache.sim.fixtures import make_pod


def pods(n: int) -> list[Any]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        pod = make_pod(f"pod-{i:05d}", f"ns-{i % 10}", f"node-{i % 50}", rng)
        pod["metadata"]["resourceVersion"] = str(i + 1)
        pod["metadata"]["creationTimestamp"] = f"2026-01-01T00:{(i // 60) % 60:02d}:{i % 60:02d}Z"
        out.append(encode_object(PODS, pod))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    objs = pods(args.pods)
    body = sum(len(o.body) for o in objs) / len(objs)
    started = time.perf_counter()
    for o in objs:
        row_of(POD, o, PODS)
    derive = (time.perf_counter() - started) / len(objs)
    # memory apart (tracemalloc slows allocation down): the row and the PartialObjectMetadata derived with
    # it (for most pods an int: where the metadata ends in the body)
    fresh = pods(min(args.pods, 2000))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for o in fresh:
        row_of(POD, o, PODS)
    per_pod = (tracemalloc.get_traced_memory()[0] - before) / len(fresh)
    tracemalloc.stop()
    print(f"{args.pods:,} sim pods, {body:,.0f} B of JSON each")
    print(f"derive: {derive * 1e6:.1f} µs per pod (once); memory: {per_pod:,.0f} B per pod ({per_pod / body:.0%})")
    page = 500
    for include in ("Metadata", "None", "Object"):
        encoding = TableEncoding(POD, "v1", include, time.time_ns)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            for i in range(0, len(objs), page):
                encoding.list_parts(PODS, objs[i : i + page], 1, "token", None)
            best = min(best, time.perf_counter() - started)
        print(f"write, includeObject={include}: {best / len(objs) * 1e6:.2f} µs per row, "
              f"{best / len(objs) * page * 1e3:.2f} ms per {page}-row page")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

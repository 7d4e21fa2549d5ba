"""In-process cost of fan-out for full-JSON watchers: the dispatcher and watchers, no sockets.

Pod MODIFIED events (~2 KB), in batches of 5, to K cluster-wide watchers (every watcher gets every
event) and to K kubelet-style watchers (``spec.nodeName=`` over 100 nodes). Prints ns of CPU
(``process_time``, so waiting for a shared core does not count) per delivery, the minimum of
``--repeat`` runs. It uses only APIs every commit has, so two commits compare back to back on the
same machine, e.g.::

    for src in /tmp/wc/OLD /tmp/wc/NEW; do PYTHONPATH=$src:. .venv/bin/python -P -m loadtest.bench.dispatch; done

(``/tmp/wc/X`` from ``git archive X watchcache | tar -x -C /tmp/wc/X``, as in
docs/lab/performance-notebook.md; ``-P``: the working directory does not go first on ``sys.path``, so
``$src``'s ``watchcache`` is the one imported).
"""

from __future__ import annotations

import argparse
import json
import time

from harness.doubles import NullSink
from watchcache.cache.object import CachedObject, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher


def _pod(i: int, rv: int) -> CachedObject:
    return encode_object(
        PODS,
        {
            "metadata": {"name": f"p{i}", "namespace": f"ns{i % 10}", "resourceVersion": str(rv), "labels": {"a": "b"}},
            "spec": {"nodeName": f"n{i % 100}", "containers": [{"name": "c", "image": "i" * 2000}]},
            "status": {"phase": "Running"},
        },
    )


def run(watchers: int, batches: int, per_batch: int, kubelet: bool) -> float:
    """ns of CPU per delivery."""
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([_pod(i, 1) for i in range(1000)], 1)
    d = Dispatcher(PODS)
    ws = []
    for k in range(watchers):
        fields = f"spec.nodeName=n{k % 100}" if kubelet else ""
        w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", fields), 1, NullSink(), max_pending_bytes=1 << 40)
        d.add(w, 0.0)
        ws.append(w)
    rv = 2
    spent = 0.0
    delivered = 0
    for b in range(batches):
        changes = []
        for j in range(per_batch):
            changes.append(("MODIFIED", _pod((b * per_batch + j) % 1000, rv)))
            rv += 1
        events = cache.apply(changes)
        before = d.events_dispatched
        t0 = time.process_time()
        d.dispatch(events)
        spent += time.process_time() - t0
        delivered += d.events_dispatched - before
        for w in ws:
            w.take()
    return spent / delivered * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    out = {
        "cluster-wide K=1000 ns/delivery": min(run(1000, 200, 5, False) for _ in range(args.repeat)),
        "kubelet K=10000 ns/delivery": min(run(10000, 200, 5, True) for _ in range(args.repeat)),
    }
    print(json.dumps({k: round(v, 1) for k, v in out.items()}))


if __name__ == "__main__":
    main()

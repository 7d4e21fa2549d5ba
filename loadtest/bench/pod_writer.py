"""Helper process: update pods at a fixed rate, each update stamped (``python -m loadtest.bench.pod_writer``).

Each update is a JSON merge patch of one pod's ``bench/written-at`` annotation, set to the time it
is sent (``time.time()``, 6 decimals: unique per write). Writes go to the upstream (kube-apiserver
or the simulated cluster), never through the proxy, on ``--connections`` keep-alive HTTP/1.1
connections with one request in flight each, paced to the rate; a write that cannot start on time
waits for a free connection (the achieved rate is reported).

The pods are read from ``--pods`` (a JSON list of ``[namespace, name, node index]``). ``run``
picks pods at random from the indexes it is given (``nodes``: only pods of these node indexes),
so the orchestrator decides whether a write is selected by a watcher (a watched node) or by none.

Commands: ``run {rate, seconds, nodes?, seed?}`` → ``{written, errors, seconds, stamps: {node:
[stamp…]}, write latency}``; ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import time
from typing import Any

from loadtest.bench import helperio
from loadtest.bench.kubeclient import STAMP_KEY, Collect, H1Conn, Target, add_target_flags


async def run(
    target: Target, conns: list[H1Conn], pods: list[tuple[str, str, int]], cmd: dict[str, Any]
) -> dict[str, Any]:
    rate = float(cmd["rate"])
    seconds = float(cmd["seconds"])
    rng = random.Random(cmd.get("seed"))
    nodes = cmd.get("nodes")
    if nodes is not None:
        allowed = set(nodes)
        pods = [p for p in pods if p[2] in allowed]
    if not pods:
        raise SystemExit("pod_writer: no pod to write")
    total = int(rate * seconds)
    free: asyncio.Queue[H1Conn] = asyncio.Queue()
    for c in conns:
        free.put_nowait(c)
    stamps: dict[int, list[str]] = collections.defaultdict(list)
    errors: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    late = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(conn: H1Conn, ns: str, name: str, node: int) -> None:
        stamp = f"{time.time():.6f}"
        body = json.dumps({"metadata": {"annotations": {STAMP_KEY: stamp}}}).encode()
        sink = Collect(keep=512)
        t = time.monotonic()
        conn.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            sink,
            body=body,
            content_type="application/merge-patch+json",
        )
        await sink.done
        latencies.append(time.monotonic() - t)
        if sink.error is not None:
            errors[sink.error] += 1
            conns.remove(conn)
            new = await target.connect()
            assert isinstance(new, H1Conn)
            conns.append(new)
            free.put_nowait(new)
            return
        if sink.status == 200:
            stamps[node].append(stamp)
        else:
            errors[str(sink.status)] += 1
        free.put_nowait(conn)

    t0 = time.monotonic()
    for k in range(total):
        due = t0 + k / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.05:
            late += 1
        conn = await free.get()
        ns, name, node = rng.choice(pods)
        task = asyncio.ensure_future(one(conn, ns, name, node))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=60)
    elapsed = time.monotonic() - t0
    latencies.sort()
    written = sum(len(v) for v in stamps.values())
    return {
        "written": written,
        "offered": total,
        "errors": dict(errors),
        "late": late,
        "seconds": round(elapsed, 3),
        "rate": round(written / elapsed, 1) if elapsed else 0.0,
        "write_ms_p50": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "write_ms_p99": round(latencies[int(len(latencies) * 0.99)] * 1000, 2) if latencies else None,
        "stamps": {str(k): v for k, v in stamps.items()},
        "cpu": helperio.rusage_cpu(),
    }


async def main_async(args: argparse.Namespace) -> None:
    target = Target(args.target, args.token, args.ca)
    with open(args.pods) as f:
        pods = [(ns, name, int(node)) for ns, name, node in json.load(f)]
    conns: list[H1Conn] = []
    for _ in range(args.connections):
        c = await target.connect()
        assert isinstance(c, H1Conn)
        conns.append(c)
    helperio.emit({"event": "ready", "pods": len(pods), "connections": len(conns)})
    async for cmd in helperio.commands():
        if cmd["cmd"] == "run":
            helperio.emit(await run(target, conns, pods, cmd))
    for c in conns:
        c.close()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_target_flags(p, "the upstream: kube-apiserver or the simulated cluster")
    p.add_argument("--pods", required=True, help="JSON file: [[namespace, name, node index], ...]")
    p.add_argument("--connections", type=int, default=16)
    uvloop.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()

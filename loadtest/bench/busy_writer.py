"""Helper process: move the upstream's resourceVersion at a fixed rate (``python -m loadtest.bench.busy_writer``).

The writes of a busy cluster come from elsewhere (500 kubelets renewing their Leases at 50 writes/s),
so the benchmark's writer is kept off the readers: in a process of its own, with no event loop shared
with the timed reads (a write's callbacks ran between a read's bytes and its clock), and on the load
side's lean client (``kubeclient.H1Conn``: 210 µs of CPU per write against aiohttp's 395 at 500
writes/s on these 2 cores), so the rig takes as little of the machine as it can from the servers
measured.

Each write is a JSON merge patch of one object, round-robin over ``--objects`` of them: a Lease's
``spec.renewTime`` (kube-apiserver), or a Secret's ``stringData`` (the simulated cluster, which serves
no Leases), on ``--connections`` keep-alive HTTP/1.1 connections with one request in flight each,
paced to the rate; a write that cannot start on time waits for a free connection.

Commands: ``start {rate}`` → ``{started}``; ``stop`` → ``{written, errors, seconds, rate, cpu}``;
``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import time

from loadtest.bench import helperio
from loadtest.bench.kubeclient import Collect, H1Conn, Target, add_target_flags


class Writer:
    """Writes at ``rate`` until ``stop``; counts what the upstream accepted."""

    def __init__(self, target: Target, conns: list[H1Conn], kind: str, namespace: str, objects: int) -> None:
        self.target = target
        self.conns = conns
        self.kind = kind
        group = "/apis/coordination.k8s.io/v1" if kind == "leases" else "/api/v1"
        self.prefix = f"{group}/namespaces/{namespace}/{kind}/node-"
        self.objects = objects
        self.written = 0
        self.errors: collections.Counter[str] = collections.Counter()

    def _body(self) -> bytes:
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        patch = {"spec": {"renewTime": now}} if self.kind == "leases" else {"stringData": {"renewed": now}}
        return json.dumps(patch).encode()

    async def run(self, rate: float, stop: asyncio.Event) -> float:
        free: asyncio.Queue[H1Conn] = asyncio.Queue()
        for c in self.conns:
            free.put_nowait(c)
        pending: set[asyncio.Task[None]] = set()

        async def one(conn: H1Conn, i: int) -> None:
            path = f"{self.prefix}{i:04d}"
            for attempt in (0, 1):
                sink = Collect(keep=0)
                conn.request("PATCH", path, sink, body=self._body(), content_type="application/merge-patch+json")
                await sink.done
                if sink.error is None:
                    break
                # The upstream closes a connection idle too long (a phase at 0 writes/s): the write is
                # sent once more on a new one, so the rate does not dip as a phase starts.
                self.conns.remove(conn)
                try:
                    new = await self.target.connect()
                except OSError as e:  # the upstream is gone: one connection fewer (``_free`` waits on)
                    self.errors[f"connect: {e}"] += 1
                    return
                assert isinstance(new, H1Conn)
                self.conns.append(new)
                conn = new
                if attempt:
                    self.errors[sink.error] += 1
            if sink.error is None:
                if sink.status == 200:
                    self.written += 1
                else:
                    self.errors[str(sink.status)] += 1
            free.put_nowait(conn)

        t0 = time.monotonic()
        if rate <= 0:
            await stop.wait()
            return time.monotonic() - t0
        for k in range(1 << 62):
            delay = t0 + k / rate - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            conn = free.get_nowait() if not free.empty() else await _free(free, stop)
            if conn is None:
                break
            task = asyncio.ensure_future(one(conn, k % self.objects))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=60)
        return time.monotonic() - t0


async def _free(free: asyncio.Queue[H1Conn], stop: asyncio.Event) -> H1Conn | None:
    """The next free connection, or None at ``stop`` (every connection may be busy, or lost)."""
    get, stopped = asyncio.ensure_future(free.get()), asyncio.ensure_future(stop.wait())
    await asyncio.wait((get, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if get.done():
        return get.result()
    get.cancel()
    return None


async def main_async(args: argparse.Namespace) -> None:
    target = Target(args.target, args.token, args.ca)
    conns: list[H1Conn] = []
    for _ in range(args.connections):
        c = await target.connect()
        assert isinstance(c, H1Conn)
        conns.append(c)
    writer = Writer(target, conns, args.kind, args.namespace, args.objects)
    helperio.emit({"event": "ready", "connections": len(conns)})
    running: asyncio.Task[float] | None = None
    stop = asyncio.Event()
    cpu0 = 0.0
    async for cmd in helperio.commands():
        if cmd["cmd"] == "start" and running is None:
            writer.written, writer.errors = 0, collections.Counter()
            stop = asyncio.Event()
            cpu0 = helperio.rusage_cpu()
            running = asyncio.ensure_future(writer.run(float(cmd["rate"]), stop))
            helperio.emit({"started": True})
        elif cmd["cmd"] == "stop" and running is not None:
            stop.set()
            seconds = await running
            running = None
            cpu = helperio.rusage_cpu() - cpu0
            helperio.emit({
                "written": writer.written,
                "errors": dict(writer.errors),
                "seconds": round(seconds, 3),
                "rate": round(writer.written / seconds, 1) if seconds else 0.0,
                "cpu_us_per_write": round(cpu / writer.written * 1e6) if writer.written else None,
            })  # fmt: skip
        else:  # every command gets an answer: the orchestrator waits for one
            helperio.emit({"error": f"{cmd['cmd']!r} while {'writing' if running else 'idle'}"})
    for c in conns:
        c.close()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_target_flags(p, "the upstream: kube-apiserver or the simulated cluster")
    p.add_argument("--kind", choices=("leases", "secrets"), default="leases")
    p.add_argument("--namespace", required=True)
    p.add_argument("--objects", type=int, required=True, help="objects named node-0000… to renew round-robin")
    p.add_argument("--connections", type=int, default=16)
    uvloop.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()

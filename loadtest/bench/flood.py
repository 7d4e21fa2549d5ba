"""Helper process: one flow's flood of reads (``python -m loadtest.bench.flood``).

The noisy neighbour is another client, on another machine in a cluster: its requests are kept out of
the process and event loop that time the quiet flow's, where answers to the flood were parsed
between a quiet answer's bytes and its clock (by aiohttp: 188–222 µs of CPU per TLS GET when it was
measured alone, at the ~3,600 answers a second kube-apiserver gave the flood: most of a core, by
that estimate; this client's measured share is the bench's "flood's client CPU" column). Here the
flood runs on the load side's lean client (``kubeclient.H1Conn``): ``--connections`` keep-alive
connections, each sending the next GET as soon as the last answer ended, 429s and all (as a client
that ignores ``Retry-After``: the flood does not back off), for the phase's seconds.

Commands: ``run {url, ca, token, path, seconds}`` → ``{event: started}`` once every connection is
dialed (TLS included: the phase's clock starts then, for the flood and the timed flow alike), then
``{statuses: {status: count}, seconds, cpu}`` (status 0: a connection failed; it is dialed again);
``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from typing import Any

from loadtest.bench import helperio
from loadtest.bench.kubeclient import Collect, H1Conn, Target


async def run(cmd: dict[str, Any], connections: int) -> dict[str, Any]:
    target = Target(cmd["url"], cmd["token"], cmd.get("ca", ""))
    path = cmd["path"]
    statuses: collections.Counter[int] = collections.Counter()
    conns: list[H1Conn] = []

    async def dial() -> H1Conn | None:
        try:
            conn = await target.connect()
        except OSError:
            statuses[0] += 1
            return None
        assert isinstance(conn, H1Conn)
        conns.append(conn)
        return conn

    async def loop(conn: H1Conn | None, end: float) -> None:
        while time.monotonic() < end:
            if conn is None or conn.closed:
                conn = await dial()
                if conn is None:
                    await asyncio.sleep(0.05)
                    continue
            sink = Collect(keep=0)
            conn.request("GET", path, sink)
            await sink.done
            statuses[0 if sink.error is not None else sink.status] += 1

    # Dialed before the phase: a flood that dialed as it started met the timed flow without its
    # load for its first ~0.1-0.2 s.
    ready = await asyncio.gather(*(dial() for _ in range(connections)))
    helperio.emit({"event": "started"})
    cpu0 = helperio.rusage_cpu()
    t0 = time.monotonic()
    try:
        await asyncio.gather(*(loop(conn, t0 + float(cmd["seconds"])) for conn in ready))
    finally:
        for c in conns:
            c.close()
    elapsed = time.monotonic() - t0
    return {
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(elapsed, 3),
        "cpu": round(helperio.rusage_cpu() - cpu0, 3),
    }


async def main_async(args: argparse.Namespace) -> None:
    helperio.emit({"event": "ready"})
    async for cmd in helperio.commands():
        if cmd["cmd"] == "run":
            helperio.emit(await run(cmd, args.connections))


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--connections", type=int, default=64, help="concurrent request loops, a connection each")
    uvloop.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()

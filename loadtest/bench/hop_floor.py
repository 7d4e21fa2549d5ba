"""The floor of one hop between processes: a byte there and back over loopback TCP, nothing else.

A request through the proxy crosses processes twice more than one sent directly (client to proxy,
proxy to upstream, and back: for a consistent GET, four wake-ups where a direct client's has two).
What such a crossing costs is a property of the machine, not of the proxy: on bare metal a few
microseconds; on a virtual machine whose idle vCPUs halt at once, a wake-up of the other vCPU is an
interrupt through the hypervisor. Linux wakes a sleeping task on an idle CPU when there is one
(``select_idle_sibling``), so on two cores that are mostly idle between requests, nearly every hop
crosses vCPUs. This measures the round trip with both ends on one vCPU, on two, and where Linux
puts them, with an idle gap every ``--burst`` round trips (as between a bench's reads, so the vCPUs
go idle), and prints the guest's halt-polling setting (``haltpoll``), which decides what waking an
idle vCPU costs. docs/performance.md ("On a slower machine: the proxy's CPU, and what a hop costs") records a run.

Run: ``.venv/bin/python -m loadtest.bench.hop_floor [--round-trips 3000]``. The last line is ``BENCH {json}``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from loadtest.bench import lib as bl


def placements(cpus: list[int]) -> list[tuple[str, int | None, int | None]]:
    """Where each end runs (the echo's CPU, the client's): a CPU of ours, or None for where Linux puts it."""
    out: list[tuple[str, int | None, int | None]] = [("one vCPU", cpus[0], cpus[0])]
    if len(cpus) > 1:
        out.append(("two vCPUs", cpus[0], cpus[1]))
    return [*out, ("as Linux places them", None, None)]


HALTPOLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def _echo(cpu: int | None) -> None:
    """The far end: echoes each read back (a child process, in a session of its own)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(64):
        conn.sendall(data)


def round_trips(n: int, burst: int, gap: float, server_cpu: int | None, client_cpu: int | None) -> dict[str, Any]:
    """``n`` one-byte round trips to an echoing child, ``gap`` seconds idle after every ``burst``: µs."""
    env, cwd = bl.child_env()
    child = subprocess.Popen(
        bl.python_m("loadtest.bench.hop_floor", "--echo", "any" if server_cpu is None else str(server_cpu)),
        stdout=subprocess.PIPE,
        env=env,
        cwd=cwd,
        preexec_fn=bl.child_preexec(),
        start_new_session=True,  # a scheduling group of its own, as the proxy and the kit's processes have
    )
    before = os.sched_getaffinity(0)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                conn.sendall(b"x")
                conn.recv(64)
                times.append(time.perf_counter() - t0)
                if (i + 1) % burst == 0:
                    time.sleep(gap)
    finally:
        os.sched_setaffinity(0, before)
        child.kill()
        child.wait()
    return bl.summarize(times, scale=1e6)  # µs


def run(n: int, burst: int, gap: float) -> dict[str, Any]:
    rows = [
        {"placement": what, **round_trips(n, burst, gap, server, client)}
        for what, server, client in placements(sorted(os.sched_getaffinity(0)))
    ]
    return {
        "rows": rows,
        "haltpoll_ns": HALTPOLL.read_text().strip() if HALTPOLL.exists() else None,
        "round_trips": n,
        "burst": burst,
        "gap_ms": gap * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--round-trips", type=int, default=3000, help="per placement")
    p.add_argument("--burst", type=int, default=10, help="round trips between idle gaps")
    p.add_argument("--gap-ms", type=float, default=1.0, help="each idle gap")
    p.add_argument("--echo", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.echo is not None:
        _echo(None if args.echo == "any" else int(args.echo))
        return
    results = run(args.round_trips, args.burst, args.gap_ms / 1e3)
    bl.print_table(
        ["placement", "p50 µs", "p90 µs", "p99 µs", "max µs"],
        [[r["placement"], r["p50"], r["p90"], r["p99"], r["max"]] for r in results["rows"]],
        title=f"One-byte round trip between two processes over loopback TCP (guest halt-polling: "
        f"{results['haltpoll_ns']} ns)",
    )
    bl.bench_line("hop_floor", {**results, "machine": bl.machine_info()})


if __name__ == "__main__":
    main()

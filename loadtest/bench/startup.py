"""Where the proxy's start-up time goes: from ``exec`` until a client is served, phase by phase.

``python -m loadtest.bench.startup [--rounds 5] [--workers 2]`` starts ``watchcache sim`` once
(``--objects`` pods, ConfigMaps in each namespace), then, ``--rounds`` times, ``watchcache serve
--upstream SIM --workers W`` on a free port, and times (wall clock, from just before ``exec``):

* ``supervisor up``: the supervisor's first log line (interpreter, imports, flags parsed);
* ``workers up``: the last worker's first log line (its interpreter and imports, or a fork);
* ``listening``: the last worker's ``worker i of W owns ...`` (its server starting on the port the
  supervisor opened before any worker started; reads get 429 until synced);
* ``discovered``: the last worker's ``caching ...`` (upstream discovery done);
* ``synced``: the last ``synced <resource>`` (every reflector's initial LIST);
* ``group ready``: the supervisor's ``watchcache serve ready`` (every worker synced);
* ``/readyz 200``: polled every 5 ms (every worker's caches synced: what a readiness probe sees);
* ``client watching``: an informer's first LIST (``resourceVersion=0``) of pods and its WATCH
  answered 200, started at ``/readyz 200``: served by whichever worker the connection lands on.

The same informer against the sim directly gives the direct client's time. Also measured: the CPU
seconds of ``import watchcache.cli`` in a fresh interpreter (median of 5), and of an interpreter
alone. Medians and ranges over the rounds are printed; the machine's load average with them.

``--baseline DIR``: the same rounds, alternating, with the package in DIR (e.g. ``git archive
024c487 watchcache | tar -x -C DIR``): before and after a change under the same machine load.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness.proxylog import log_time
from loadtest.bench import lib as bl

PHASES = ("supervisor up", "workers up", "listening", "discovered", "synced", "group ready", "/readyz 200",
          "client watching")  # fmt: skip


def phases(log: str, t0: float, workers: int) -> dict[str, float]:
    """Seconds from t0 to each phase, read from the proxy's log."""
    out: dict[str, float] = {}
    first: dict[str, float] = {}
    last_of: dict[str, float] = {}
    for line in log.splitlines():
        t = log_time(line)
        if t is None:
            continue
        rel = t - t0
        out.setdefault("supervisor up", rel)
        m = re.match(r"\S+ \S+ \S+ (w\d+) ", line)
        if m:
            first.setdefault(m.group(1), rel)
        for phase, pattern in (
            ("listening", r"worker \d+ of \d+ owns "),
            ("discovered", r" watchcache: caching "),
            ("synced", r" synced \S+: "),
        ):
            if re.search(pattern, line):
                last_of[phase] = rel
        if "watchcache serve ready: listening" in line:
            out["group ready"] = rel
    if len(first) >= workers:
        out["workers up"] = max(first.values())
    out.update(last_of)
    return out


def client_watching(url: str) -> float:
    """An informer's start: LIST pods rv=0, then WATCH from its rv until the response head (seconds)."""
    t0 = time.monotonic()
    with urllib.request.urlopen(url + "/api/v1/pods?resourceVersion=0&limit=500", timeout=30) as resp:
        body = resp.read()
    rv = re.search(rb'"resourceVersion":"(\d+)"', body[:4096])
    assert rv, body[:300]
    watch = f"{url}/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={rv.group(1).decode()}"
    with urllib.request.urlopen(watch, timeout=30) as resp:
        assert resp.status == 200
    return time.monotonic() - t0


def wait_readyz(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.005)
    raise TimeoutError(f"{url} not ready in {timeout}s")


def one_round(sim_url: str, workers: int, extra: list[str], src: str = "") -> dict[str, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    fd, log_name = tempfile.mkstemp(prefix="bench-startup-", suffix=".log")
    argv = [*bl.watchcache_exe(), "serve", "--listen", f"127.0.0.1:{port}", "--upstream", sim_url,
            "--workers", str(workers), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cwd = None
    if src:  # that copy of the package first, and not the work tree as cwd (``python -m`` would prefer it)
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        cwd = "/"
    t0 = time.time()
    with os.fdopen(fd, "wb") as out:
        # In a scheduling group of its own, as ``bl.Proc`` starts the proxy.
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            preexec_fn=bl.child_preexec(),
            start_new_session=True,
        )
    try:
        wait_readyz(url)
        ready = time.time() - t0
        watching = client_watching(url)
        result = phases(Path(log_name).read_text(errors="replace"), t0, workers)
        result["/readyz 200"] = ready
        result["client watching"] = ready + watching
        return result
    finally:
        proc.terminate()
        proc.wait(30)
        os.unlink(log_name)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def import_cpu(statement: str, n: int = 5, src: str = "") -> float:
    code = f"import time; t = time.process_time(); {statement}; print(time.process_time() - t)"
    env = {**os.environ, "PYTHONPATH": src} if src else None
    cwd = "/" if src else None
    values = [float(subprocess.check_output([sys.executable, "-c", code], text=True, env=env, cwd=cwd))
              for _ in range(n)]  # fmt: skip
    return statistics.median(values)


def interpreter_cpu(n: int = 5) -> float:
    values = []
    for _ in range(n):
        before = os.times()
        subprocess.check_call([sys.executable, "-c", "pass"])
        after = os.times()
        values.append((after.children_user - before.children_user) + (after.children_system - before.children_system))
    return statistics.median(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--objects", type=int, default=1000, help="pods in the sim")
    p.add_argument("--proxy-args", default="", help="more flags for watchcache serve")
    p.add_argument("--baseline", default="", help="also run the package in this directory, rounds alternating")
    args = p.parse_args()
    bl.log(f"machine: {bl.machine_info()}")
    sim = bl.start_sim(objects=args.objects, namespaces=10)
    sources = {"this tree": ""} | ({f"baseline {args.baseline}": args.baseline} if args.baseline else {})
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    direct: list[float] = []
    try:
        bl.wait_ready(sim)
        for n in range(args.rounds):
            direct.append(client_watching(sim.url))
            for name, src in sources.items():
                rounds[name].append(one_round(sim.url, args.workers, args.proxy_args.split(), src))
                bl.log(f"round {n + 1} ({name}): " + ", ".join(f"{k} {v:.2f}" for k, v in rounds[name][-1].items()))
    finally:
        sim.stop()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    names = list(sources)
    rows = []
    for phase in PHASES:
        row = [phase]
        for name in names:
            values = sorted(r[phase] for r in rounds[name] if phase in r)
            row.append(f"{statistics.median(values):.2f} ({values[0]:.2f}–{values[-1]:.2f})" if values else "-")
        rows.append(row)
    rows.append(
        [
            "(direct client on the sim: LIST + WATCH)",
            f"{statistics.median(direct):.2f} ({min(direct):.2f}–{max(direct):.2f})",
            *[""] * (len(names) - 1),
        ]
    )
    bl.print_table(["phase (s from exec): median (range)", *names], rows,
                   title=f"watchcache serve --workers {args.workers}: start-up, {args.rounds} rounds "
                         f"(load average {load})")  # fmt: skip
    cpu = {"interpreter": interpreter_cpu()}
    for name, src in sources.items():
        cpu[f"import watchcache.cli ({name})"] = import_cpu("import watchcache.cli", src=src)
    print("CPU seconds (median of 5): " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()))
    bl.bench_line("startup", {"rounds": rounds, "direct": direct, "cpu": cpu, "load": load})


if __name__ == "__main__":
    main()

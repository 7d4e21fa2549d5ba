"""``watchcache demo``: the simulated cluster and the watch cache in front of it, as two processes.

What ``make run`` starts: the same topology as production (proxy → apiserver over HTTP),
with the simulated cluster standing in for the apiserver.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import urllib.request


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1.0) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def run_demo(args: argparse.Namespace) -> int:
    exe = [sys.executable, "-m", "watchcache"]
    sim = subprocess.Popen(
        [
            *exe,
            "sim",
            "--listen",
            args.sim_listen,
            "--objects",
            str(args.objects),
            "--namespaces",
            str(args.namespaces),
            "--churn",
            str(args.churn),
        ]
    )
    procs = [sim]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if not _wait_ready(f"http://{args.sim_listen}", sim, 120.0):
            print("watchcache demo: the simulated cluster did not start", file=sys.stderr)
            return 1
        proxy = subprocess.Popen([*exe, "serve", "--listen", args.listen, "--upstream", f"http://{args.sim_listen}"])
        procs.append(proxy)
        if not _wait_ready(f"http://{args.listen}", proxy, 120.0):
            print("watchcache demo: the proxy did not become ready", file=sys.stderr)
            return 1
        print(
            f"\nwatchcache is ready at http://{args.listen} (simulated cluster at http://{args.sim_listen})\n"
            f"try:  kubectl --server http://{args.listen} get pods -A --chunk-size=50\n"
            f"      kubectl --server http://{args.listen} get configmaps -n ns-1 -w\n",
            flush=True,
        )
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

"""``watchcache demo``: the simulated cluster and the watch cache in front of it, as two processes.

What ``make run`` starts: the same topology as production (proxy → apiserver over HTTP),
with the simulated cluster standing in for the apiserver.

The demo binds both addresses itself, before either part starts, and hands each part its
socket (``--listen-fd``). So a busy address fails the demo at once with the kernel's answer, and
the demo's readiness polls can only ever reach its own parts: before, a ``--sim-listen`` already
taken by another simulator was polled ready, and the demo said "watchcache is ready" in front of
someone else's cluster. The demo exits non-zero when either part fails, at start or later.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from watchcache.argtypes import parse_listen
from watchcache.http.listener import bind_listener


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


def _address(sock: socket.socket, host: str) -> str:
    """``host:port`` of a bound socket (port 0 resolved)."""
    port = sock.getsockname()[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _start(argv: list[str], sock: socket.socket) -> subprocess.Popen[bytes]:
    """A part, serving on ``sock`` (the demo's copy is closed: the part owns the address now)."""
    fd = sock.fileno()
    proc = subprocess.Popen([sys.executable, "-m", "watchcache", *argv, "--listen-fd", str(fd)], pass_fds=(fd,))
    sock.close()
    return proc


def run_demo(args: argparse.Namespace) -> int:
    sim_host, sim_port = parse_listen(args.sim_listen)
    proxy_host, proxy_port = parse_listen(args.listen)
    sim_sock = bind_listener(sim_host, sim_port)
    try:
        proxy_sock = bind_listener(proxy_host, proxy_port)
    except OSError:
        sim_sock.close()
        raise
    sim_address, proxy_address = _address(sim_sock, sim_host), _address(proxy_sock, proxy_host)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parts: dict[str, subprocess.Popen[bytes]] = {}
    try:
        sim_args = ["--objects", str(args.objects), "--namespaces", str(args.namespaces), "--churn", str(args.churn)]
        parts["the simulated cluster"] = sim = _start(["sim", "--listen", sim_address, *sim_args], sim_sock)
        if not _wait_ready(f"http://{sim_address}", sim, 120.0):
            print(f"watchcache demo: the simulated cluster did not start (exit {sim.poll()})", file=sys.stderr)
            return 1
        serve = ["serve", "--listen", proxy_address, "--upstream", f"http://{sim_address}"]
        parts["the proxy"] = proxy = _start(serve, proxy_sock)
        if not _wait_ready(f"http://{proxy_address}", proxy, 120.0):
            print(f"watchcache demo: the proxy did not become ready (exit {proxy.poll()})", file=sys.stderr)
            return 1
        print(
            f"\nwatchcache is ready at http://{proxy_address} (simulated cluster at http://{sim_address})\n"
            f"try:  kubectl --server http://{proxy_address} get pods -A --chunk-size=50\n"
            f"      kubectl --server http://{proxy_address} get configmaps -n ns-1 -w\n",
            flush=True,
        )
        while not stopping:
            for name, part in parts.items():
                if part.poll() is not None:
                    print(f"watchcache demo: {name} exited (exit {part.returncode})", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        codes = _stop(parts)
        return 0 if all(code == 0 for code in codes) else 1
    finally:
        sim_sock.close()
        proxy_sock.close()
        _stop(parts)


def _stop(parts: dict[str, subprocess.Popen[bytes]]) -> list[int]:
    """SIGTERM to the parts still running (the proxy first), then their exit codes."""
    for p in reversed(parts.values()):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in parts.values():
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return [p.returncode for p in parts.values()]

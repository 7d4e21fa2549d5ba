"""The supervisor: start W workers on one port, restart the ones that die, stop them all.

In gunicorn's arbiter's manner: signal handlers only queue the signal; one loop dispatches
``handle_<signal>``, reaps children and restarts them with backoff (jittered,
so that workers that died together do not come back in lockstep). Workers are forked from the
supervisor, which has already imported everything (gunicorn's ``preload_app``): a worker starts,
or restarts after a crash, without a new interpreter and its imports (0.5–0.7 s of CPU each,
more than half of a proxy's start-up; docs/lab/performance-notebook.md). The supervisor never runs an event
loop or a thread, so a fork of it is clean. As gunicorn's arbiter, the supervisor binds and
listens on the public port itself, without SO_REUSEPORT, before any worker starts, and every
worker accepts on that one inherited socket (``--listen-fd``): so the kernel refuses the address
to a second instance, whatever either's worker count, and a restarting worker finds the port
still open, its connections waiting in the backlog (``watchcache.http.listener`` says why).
Workers are told their id, the worker count, the shard directory (their unix sockets and ready
files) and the continue-token key file, so a token minted by one worker is honoured by all.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from watchcache.backoff import Backoff
from watchcache.http.listener import bind_listener
from watchcache.shard.layout import MARKERS, SYNCED, ShardDir

log = logging.getLogger("watchcache.shard.supervisor")

# A worker that exits with this code is misconfigured: restarting it would only loop.
EXIT_CONFIG = 2
# Flags the supervisor sets per worker; the ones given to ``serve`` are not passed on.
PER_WORKER_FLAGS = frozenset({"--listen", "--listen-fd", "--workers", "--continue-token-key-file"})


#: The environment variable that tells a worker its supervisor's pid (``service.lifecycle`` exits
#: when it is gone): a worker's own parent at the time it looks may already be init.
SUPERVISOR_PID = "WATCHCACHE_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def die_with(supervisor: int) -> None:
    """In a worker just forked: end with ``supervisor``, however it ends (SIGKILL included).

    Linux sends the worker SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), from now on: during
    its start too, which the worker's own periodic check cannot cover. A supervisor already gone
    (killed between the fork and here) is seen at once. Elsewhere the periodic check in
    ``service.lifecycle`` remains, told the supervisor's pid through the environment.
    """
    os.environ[SUPERVISOR_PID] = str(supervisor)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:
        os._exit(0)


def without_per_worker_flags(argv: list[str]) -> list[str]:
    """``serve``'s argv minus the ``--flag value`` / ``--flag=value`` options the supervisor sets per worker."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in PER_WORKER_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


class ForkedWorker:
    """A forked worker, behind the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class WorkerSlot:
    id: int
    process: subprocess.Popen[bytes] | ForkedWorker | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 10.0))
    next_start: float = 0.0
    pids: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        serve_args: list[str],
        workers: int,
        host: str,
        port: int,
        *,
        continue_key_file: str | None = None,
        drain_timeout: float = 10.0,
        run_worker: Callable[[list[str]], int] | None = None,
        listener: socket.socket | None = None,
    ) -> None:
        """``run_worker(argv)``: a worker's ``watchcache ARGV`` in a forked child (its exit code); without
        it, each worker is a new ``python -m watchcache`` process. ``listener``: the public socket, already
        listening (handed down by ``watchcache demo``); without it, ``run`` binds ``host:port``."""
        self.worker_args = without_per_worker_flags(serve_args)
        self.workers = workers
        self.host = host
        self.port = port
        self.drain_timeout = drain_timeout
        self.run_worker = run_worker
        # The public socket, listening; every worker accepts on it. Bound in ``run`` (or given).
        self.listener = listener
        self.shard_dir = Path(tempfile.mkdtemp(prefix="watchcache-"))
        self.layout = ShardDir(self.shard_dir)
        if continue_key_file is None:
            key = self.layout.continue_key
            key.write_bytes(os.urandom(32).hex().encode())
            key.chmod(0o600)
            continue_key_file = str(key)
        self.continue_key_file = continue_key_file
        self.slots = [WorkerSlot(i) for i in range(workers)]
        self._signals: list[int] = []
        self._stopping = False
        self._announced = False

    # ------------------------------------------------------------------ signals

    def _queue(self, signum: int, frame: object) -> None:
        self._signals.append(signum)

    def handle_term(self) -> None:
        self._stopping = True

    handle_int = handle_term

    # ------------------------------------------------------------------ workers

    def _spawn(self, slot: WorkerSlot) -> None:
        for marker in MARKERS:
            self.layout.marker(slot.id, marker).unlink(missing_ok=True)
        argv = [
            "serve", *self.worker_args,
            "--listen", f"{self.host}:{self.port}",
            "--listen-fd", str(self._listener_fd()),
            "--workers", str(self.workers),
            "--worker-id", str(slot.id),
            "--shard-dir", str(self.shard_dir),
            "--continue-token-key-file", self.continue_key_file,
        ]  # fmt: skip
        if self.run_worker is None:
            env = {**os.environ, SUPERVISOR_PID: str(os.getpid())}
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "watchcache", *argv], env=env, pass_fds=(self._listener_fd(),)
            )
        else:
            slot.process = self._fork(argv)
        slot.started = time.monotonic()
        slot.pids.append(slot.process.pid)
        log.info("worker %d started (pid %d)", slot.id, slot.process.pid)

    def _fork(self, argv: list[str]) -> ForkedWorker:
        sys.stdout.flush()
        sys.stderr.flush()
        supervisor = os.getpid()
        pid = os.fork()
        if pid:
            return ForkedWorker(pid)
        # The worker. Nothing of the supervisor's may run in it: it leaves with os._exit.
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)  # until its event loop installs its own
            die_with(supervisor)
            if self.listener is not None:
                self.listener.detach()  # the worker's own socket object (--listen-fd) owns the descriptor now
            random.seed()  # not the supervisor's sequence, nor a sibling's
            code = self.run_worker(argv) if self.run_worker is not None else 1
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _reap(self) -> int | None:
        """Restart dead workers (with backoff); returns an exit code if the group must stop."""
        now = time.monotonic()
        for slot in self.slots:
            proc = slot.process
            if proc is not None and proc.poll() is not None:
                code = proc.returncode
                slot.process = None
                if code == EXIT_CONFIG:
                    log.error("worker %d exited with a configuration error; stopping", slot.id)
                    return EXIT_CONFIG
                if now - slot.started > 30.0:
                    slot.backoff.reset()  # it had been running fine: start the schedule again
                slot.restarts += 1
                self._write_restarts()
                delay = slot.backoff.next()
                slot.next_start = now + (0.0 if slot.restarts == 1 else delay)
                log.warning("worker %d (pid %d) exited with %s; restart #%d", slot.id, proc.pid, code, slot.restarts)
            if slot.process is None and now >= slot.next_start:
                self._spawn(slot)
        return None

    def _write_restarts(self) -> None:
        """For the workers' /metrics (watchcache_worker_restarts_total)."""
        path = self.layout.restarts_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({s.id: s.restarts for s in self.slots}))
        tmp.replace(path)

    def _listener_fd(self) -> int:
        assert self.listener is not None, "run() binds the listener before it starts a worker"
        return self.listener.fileno()

    def _announce_when_ready(self) -> None:
        """Logs ``ready`` once every worker has synced: when the group's ``/readyz`` answers 200 (each
        worker's check waits for every worker's ``synced`` mark), not merely when they all listen."""
        if self._announced:
            return
        if all(self.layout.marker(s.id, SYNCED).exists() for s in self.slots):
            self._announced = True
            scheme = "https" if "--tls-cert-file" in " ".join(self.worker_args) else "http"
            log.info(
                "watchcache serve ready: listening on %s://%s:%d (%d workers, shard dir %s)",
                scheme,
                self.host,
                self.port,
                self.workers,
                self.shard_dir,
            )

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        if self.listener is None:
            try:
                self.listener = bind_listener(self.host, self.port)
            except OSError:
                # The port is taken (or not ours): nothing started, so nothing may stay behind.
                self._remove_shard_dir()
                raise
        listener = self.listener
        self.port = listener.getsockname()[1]
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._queue)
        code = 0
        try:
            for slot in self.slots:
                self._spawn(slot)
            self._write_restarts()
            while not self._stopping:
                while self._signals:
                    signum = self._signals.pop(0)
                    getattr(self, f"handle_{signal.Signals(signum).name[3:].lower()}")()
                if self._stopping:
                    break
                stop_code = self._reap()
                if stop_code is not None:
                    code = stop_code
                    break
                self._announce_when_ready()
                time.sleep(0.05)
        finally:
            self._stop_all()
            listener.close()
        log.info("watchcache serve stopped")
        return code

    def _stop_all(self) -> None:
        running = [s.process for s in self.slots if s.process is not None and s.process.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain_timeout + 5.0
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop in time; killing it", proc.pid)
                proc.kill()
                proc.wait()
        self._remove_shard_dir()

    def _remove_shard_dir(self) -> None:
        for path in self.shard_dir.glob("*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.shard_dir.rmdir()

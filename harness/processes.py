"""Real processes on real sockets: start one, wait for its ready line, stop it by its own pid.

Every process the tests and the benchmarks start goes through :class:`Proc`: its output goes to a
log file (a temporary one unless the caller names it), and :meth:`Proc.wait_ready` searches the part
of that file written since the last :meth:`Proc.start` for the ready line, so a process restarted on
the same log (appended) is recognised anew. The ready line carries the URL it listens on: a process
told to listen on port 0 says which port it got, and tests run in parallel without port clashes.

A process's life::

    Proc(argv) --start()--> running --wait_ready()--> ready (url set)
                               |                          |
                               +------ stop(): SIGTERM, then SIGKILL after the timeout
                               +------ kill(): SIGKILL (its whole session with new_session), as a crash

Every wait is bounded, and a process is stopped by its own pid (or its own session), never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# "ready: listening on URL", or "serving, not ready: REASON; listening on URL" (service/readiness.py);
# the simulator and the relay say it too (the relay adds " control URL").
READY = re.compile(r"listening on (https?://[\d.]+:\d+)")
# The sharded proxy's supervisor, once every worker has said its own ready line.
SUPERVISOR_READY = re.compile(r"watchcache serve ready: listening on (https?://[\d.]+:\d+)")


class NotReady(RuntimeError):
    """The process exited, or did not print its ready line in time; the message holds its log's tail."""


def python_m(*args: str) -> list[str]:
    """``python -m ARGS`` with this interpreter, e.g. ``python_m("watchcache", "sim", …)``."""
    return [sys.executable, "-m", *args]


def free_port() -> int:
    """A port free now (bound to port 0 and released): for a process that must keep its port across restarts.
    Another process may take it meanwhile; a caller that cannot retry should listen on port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def nofile_limit(soft: int, hard: int) -> Callable[[], None]:
    """A ``preexec`` that starts the child with this open-files limit."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def running(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it (Linux's /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def dies_with_parent(then: Callable[[], object] | None = None) -> Callable[[], None]:
    """A ``preexec`` (``then`` too): the child gets SIGTERM when this process dies (Linux's
    PR_SET_PDEATHSIG, as a supervisor's workers do). A killed pytest or bench otherwise leaves its
    proxies running, holding ports and CPU through the next run; a child in a session of its own
    is not even in the group a ^C or a ``timeout`` signals. Linux sends the signal when the *thread*
    that forked ends, so it is asked for only from the main thread (built in the thread that starts
    the child): a child started from a pool thread (``asyncio.to_thread``) would get it when the
    pool shuts down."""
    parent = os.getpid()
    libc = _LIBC if threading.current_thread() is threading.main_thread() else None

    def preexec() -> None:
        if then is not None:
            then()
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died between fork and prctl
                os._exit(1)

    return preexec


@dataclass(eq=False)
class Proc:
    """One process: its command line, its log, and once ready the URL its ready line named."""

    argv: list[str]
    name: str = "process"
    ready: re.Pattern[str] = READY
    # None: a temporary file, removed by stop() unless the process had died on its own (kept for the post-mortem).
    log_path: Path | None = None
    env: dict[str, str] | None = None  # None: this process's environment (always with PYTHONUNBUFFERED=1)
    cwd: str | None = None
    preexec: Callable[[], None] | None = None
    # Its own session (process group): kill() then kills the group, e.g. `watchcache demo` and its children.
    new_session: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    url: str = field(default="", init=False)
    match: re.Match[str] | None = field(default=None, init=False)
    starts: list[float] = field(default_factory=list, init=False)  # time.monotonic() of every start
    _offset: int = field(default=0, init=False)
    _temporary: bool = field(default=False, init=False)
    _kept: str | None = field(default=None, init=False)  # a removed temporary log's last output

    def start(self) -> Proc:
        """Start it (again); its output is appended to the log."""
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix=f"harness-{self.name}-", suffix=".log")
            os.close(fd)
            self.log_path, self._temporary = Path(path), True
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**(os.environ if self.env is None else self.env), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                preexec_fn=dies_with_parent(self.preexec),
                start_new_session=self.new_session,
            )
        self.url, self.match, self._kept = "", None, None
        self.starts.append(time.monotonic())
        return self

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Until the ready line is in what it wrote since it started; its URL. :class:`NotReady` if it exits first."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.ready.search(self.output())
            if m:
                self.match, self.url = m, m.group(1)
                return self.url
            if not self.running() or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        raise NotReady(f"{self.name} ({shlex.join(self.argv)}) did not print its ready line:\n{self.log_tail(40)}")

    def up(self, timeout: float = 30.0) -> Proc:
        """start() and wait_ready(); a process that does not get ready is killed."""
        self.start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    # ---------------------------------------------------------------- reading it

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def host_port(self) -> str:
        """``host:port`` of its URL."""
        return self.url.split("://", 1)[1]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.host_port.rsplit(":", 1)
        return host, int(port)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    def group(self, n: int) -> str:
        """Group ``n`` of its ready line ("" if the line had none), e.g. the relay's control URL."""
        return (self.match.group(n) or "") if self.match and self.match.lastindex and n <= self.match.lastindex else ""

    def output(self) -> str:
        """What it wrote since its last start (still there once stopped)."""
        if self._kept is not None:
            return self._kept
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    @property
    def log(self) -> list[str]:
        """Its lines since its last start (the last one may still be partial)."""
        return self.output().splitlines(keepends=True)

    def log_tail(self, n: int = 20) -> str:
        return "".join(self.log[-n:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ---------------------------------------------------------------- ending it

    def kill(self) -> None:
        """SIGKILL, as a crash (its whole session with ``new_session``)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            if self.new_session:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
        self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Its exit code (None if it had to be killed)."""
        if self.process is None:
            return None
        died_alone = self.process.poll() is not None
        code: int | None = self.process.returncode
        if not died_alone:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                code = None
        if self._temporary and self.log_path is not None and not died_alone and not os.environ.get("HARNESS_KEEP_LOGS"):
            self._kept = self.output()
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return code


def stop_all(procs: Iterable[Proc | None]) -> list[str]:
    """Stop every one (in the order given) even if one fails to; what went wrong, one line each."""
    errors: list[str] = []
    for p in procs:
        if p is None:
            continue
        try:
            p.stop()
        except Exception as e:
            errors.append(f"{p.name}: {e!r}")
    return errors


def logged(proc: Proc, text: str) -> bool:
    return text in proc.output()


def wait_logged(proc: Proc, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
    """The first log line that matches, waiting for it (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        found = next((line for line in proc.log if predicate(line)), None)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{proc.name}: not logged:\n{proc.log_tail()}"
        time.sleep(0.05)


def http_status(url: str, *, timeout: float = 2.0, context: ssl.SSLContext | None = None) -> int:
    """The status of a GET (0 when it could not connect)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def wait_ok(
    url: str, timeout: float = 30.0, *, context: ssl.SSLContext | None = None, proc: Proc | None = None
) -> None:
    """Until a GET of ``url`` answers 200; :class:`NotReady` after ``timeout``, or at once if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    status = 0
    while time.monotonic() < deadline:
        if proc is not None and proc.process is not None and not proc.running():
            raise NotReady(f"{proc.name} exited with {proc.process.returncode}:\n{proc.log_tail(30)}")
        status = http_status(url, context=context)
        if status == 200:
            return
        time.sleep(0.05)
    tail = f":\n{proc.log_tail(30)}" if proc is not None else ""
    raise NotReady(f"{url} not 200 after {timeout:.0f}s (last status {status}){tail}")


def wait_ready(proc: Proc, timeout: float = 30.0, *, context: ssl.SSLContext | None = None) -> None:
    """Until ``/readyz`` answers 200: a proxy listens before its caches have synced."""
    wait_ok(proc.url + "/readyz", timeout, context=context, proc=proc)


def rss_kb(pid: int) -> int:
    """VmRSS of one process, in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


# ---------------------------------------------------------------- watchcache itself


def start(*args: str, timeout: float = 30.0, nofile: tuple[int, int] | None = None) -> Proc:
    """``watchcache ARGS --listen 127.0.0.1:0``, until its ready (or serving, not ready) line.

    ``nofile``: the (soft, hard) open-files limit it starts with."""
    name = args[0] if args else "watchcache"
    preexec = nofile_limit(*nofile) if nofile is not None else None
    return Proc(python_m("watchcache", *args, "--listen", "127.0.0.1:0"), name=name, preexec=preexec).up(timeout)


@dataclass
class Stack:
    """``watchcache sim`` as the upstream and ``watchcache serve --upstream`` in front of it."""

    sim: Proc
    proxy: Proc

    def stop(self) -> None:
        errors = stop_all([self.proxy, self.sim])
        assert not errors, errors


def start_stack(*proxy_args: str, sim_args: tuple[str, ...] = ("--objects", "120", "--namespaces", "3")) -> Stack:
    """A simulator and a proxy in front of it, the proxy ready (every cache synced)."""
    sim = start("sim", *sim_args)
    try:
        proxy = start("serve", "--upstream", sim.url, *proxy_args)
        try:
            wait_ready(proxy)
        except BaseException:
            proxy.stop()
            raise
    except BaseException:
        sim.stop()
        raise
    return Stack(sim, proxy)

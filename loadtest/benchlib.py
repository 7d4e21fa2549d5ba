"""Shared helpers for the hot-path benchmarks (``loadtest/bench_*.py``).

* process management: start ``watchcache sim`` / ``watchcache serve`` on port 0, parse the
  ``ready: listening on http://…`` line, wait for ``/readyz``, stop with SIGTERM;
* ``/proc`` readings: RSS (VmRSS) and CPU seconds of a process;
* percentiles, tables and the final ``BENCH {json}`` line;
* the load-side processes the benchmarks run next to the system under test, started as
  ``python loadtest/benchlib.py ROLE …`` so that they never share a core's event loop
  with the orchestrator:

  - ``watch-reader``: N watch connections on raw sockets (uvloop ``BufferedProtocol``,
    one shared 256 KB receive buffer), counting frames (``}\\n``) and parsing only the
    ``bench/written-at`` stamps on a sample of the connections;
  - ``raw-fanout``: the fan-out ceiling, a bare uvloop server writing pre-built pod watch
    frames to every connection, coalesced into one chunk per connection per loop pass;
  - ``raw-list``: the LIST ceiling, a bare uvloop server answering with ``writelines`` of
    pre-encoded per-item bytes;
  - ``list-client``: C keep-alive connections issuing LISTs (full or paged) back to back.

  They talk to the orchestrator with one JSON object per line on stdin/stdout.

  With ``--tls`` (clients) / ``--tls-cert`` and ``--tls-key`` (ceilings) they speak TLS, and clients
  send ``--token`` as a bearer token: the production configuration (``Production``,
  ``add_production_flags``, ``ProductionFiles``: certificate, token file, the sim's policy).

Nothing here imports ``watchcache``: the benchmarks drive the real processes over HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
READY = re.compile(r"ready: listening on (https?://[\d.]+:\d+)")
STAMP_KEY = "bench/written-at"
STAMP_MARK = b'"bench/written-at":"'
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Benchmark another copy of the package (e.g. a snapshot of a commit made with
# ``git archive HEAD watchcache | tar -x -C DIR``) instead of the work tree: its parent dir.
SRC = os.environ.get("WATCHCACHE_BENCH_SRC", "")


# ---------------------------------------------------------------- limits


def raise_nofile() -> int:
    """Raise this process's open-file limit to its hard limit (10,000 watchers need 10,000 fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------- /proc


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` in bytes."""
    return _status_kb(pid, "VmRSS") * 1024


def status_fields(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of ``pid`` in bytes."""
    return {k: _status_kb(pid, k) * 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    idle = fields[3] + fields[4]
    return (total - idle) / CLK_TCK, total / CLK_TCK


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (a sharded ``watchcache serve`` is a supervisor plus workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError):
            total += cpu_seconds(p)
    return total


def tree_rss_bytes(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, KeyError):
            total += rss_bytes(p)
    return total


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cores": os.cpu_count(),
        "cpu": model,
        "python": sys.version.split()[0],
        "loadavg_at_start": [round(x, 2) for x in load],
        "commit": _git_head(),
        "source": SRC or str(ROOT),
    }


def _git_head() -> str:
    """HEAD, plus "+dirty" when the work tree differs from it (read-only git commands).

    With ``WATCHCACHE_BENCH_SRC``: the content of its ``COMMIT`` file, if any.
    """
    if SRC:
        with contextlib.suppress(OSError):
            return Path(SRC, "COMMIT").read_text().strip()
        return "snapshot"
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        # --no-optional-locks: never write the index (other people work in this tree).
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "watchcache"],
            capture_output=True,
            timeout=5,
        ).returncode
        return head + ("+dirty" if dirty == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------- the production configuration

# The simulated cluster's users (watchcache/sim/policy-example.yaml): the proxy's own identity, a user
# who may list and watch pods and configmaps everywhere (the watches and LISTs measured), and an admin
# (the benchmark's writes to the sim and its reads of /debug and /metrics).
POLICY_FILE = ROOT / "watchcache" / "sim" / "policy-example.yaml"
PROXY_TOKEN = "watchcache-token"
CLIENT_TOKEN = "alice-token"
ADMIN_TOKEN = "admin-token"
AUTH_MODES = ("none", "delegated")
# Set by ``Production.setup`` when the sim enforces a policy: sent by ``http()`` on every request.
_admin_token = ""


@dataclass(frozen=True)
class Production:
    """How the proxy under test is run: TLS, delegated authentication, worker count.

    ``workers=None`` is the product's default (one per CPU the container may use).
    """

    tls: bool = False
    authentication: str = "none"
    workers: int | None = None

    @property
    def delegated(self) -> bool:
        return self.authentication == "delegated"

    @property
    def label(self) -> str:
        parts = ["tls" if self.tls else "http"]
        if self.delegated:
            parts.append("delegated")
        parts.append(f"w{self.workers}" if self.workers else "wdefault")
        return "+".join(parts)

    def but(self, **changes: Any) -> Production:
        return dataclasses.replace(self, **changes)


def add_production_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("production configuration (the proxy under test)")
    g.add_argument("--tls", action="store_true", help="serve HTTPS (a self-signed certificate made at run time)")
    g.add_argument(
        "--authentication",
        choices=AUTH_MODES,
        default="none",
        help="delegated: TokenReview/SubjectAccessReview against the sim's policy; clients send a bearer token",
    )
    g.add_argument("--workers", type=int, default=None, help="proxy workers (default: the product's default)")
    g.add_argument("--production", action="store_true", help="shorthand: --tls --authentication delegated")


def production_from_args(args: argparse.Namespace) -> Production:
    if args.production:
        args.tls = True
        args.authentication = "delegated"
    return Production(tls=args.tls, authentication=args.authentication, workers=args.workers)


class ProductionFiles:
    """The certificate, token file and sim policy a production-configured run needs (one temp dir)."""

    def __init__(self, any_delegated: bool, any_tls: bool) -> None:
        global _admin_token
        self.dir = Path(tempfile.mkdtemp(prefix="bench-prod-"))
        self.policy = any_delegated
        self.cert: tuple[Path, Path] | None = make_tls_cert(self.dir) if any_tls else None
        self.token_file = self.dir / "token"
        self.token_file.write_text(PROXY_TOKEN)
        if any_delegated:
            _admin_token = ADMIN_TOKEN

    def sim_flags(self) -> list[str]:
        """With delegated authentication the sim enforces the policy and answers the reviews."""
        return ["--policy-file", str(POLICY_FILE)] if self.policy else []

    def proxy_flags(self, prod: Production) -> list[str]:
        out: list[str] = []
        if self.policy:
            out += ["--token-file", str(self.token_file)]  # the proxy's identity at a sim that checks it
        if prod.tls:
            assert self.cert is not None
            out += ["--tls-cert-file", str(self.cert[0]), "--tls-private-key-file", str(self.cert[1])]
        if prod.delegated:
            out += ["--authentication", "delegated"]
        if prod.workers:
            out += ["--workers", str(prod.workers)]
        return out

    @property
    def client_token(self) -> str:
        return CLIENT_TOKEN if self.policy else ""

    def tls_args(self) -> list[str]:
        """The ceilings' flags: serve TLS with the proxy's certificate."""
        assert self.cert is not None
        return ["--tls-cert", str(self.cert[0]), "--tls-key", str(self.cert[1])]

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def make_tls_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed ECDSA P-256 serving certificate for 127.0.0.1 (cheap handshakes for 10,000 watchers)."""
    crt, key = directory / "serving.crt", directory / "serving.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return crt, key


def client_tls() -> ssl.SSLContext:
    """A client context that trusts anything (the benchmark's own self-signed certificate)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def server_tls(cert: str, key: str) -> ssl.SSLContext:
    """The ceilings' server context: as ``watchcache.http.tls.ServingCert`` (TLS >= 1.2, ALPN http/1.1)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(cert, key)
    return ctx


def auth_header(token: str) -> bytes:
    return f"Authorization: Bearer {token}\r\n".encode() if token else b""


# ---------------------------------------------------------------- processes


def watchcache_exe() -> list[str]:
    return [sys.executable, "-m", "watchcache"]


@dataclass
class Proc:
    """A started ``watchcache`` process (or any process that prints the ready line)."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        return host, int(port)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    def cpu(self) -> float:
        """CPU seconds of the process and its children (workers)."""
        return tree_cpu_seconds(self.pid)

    def rss(self) -> int:
        """VmRSS of the process and its children (workers), summed."""
        return tree_rss_bytes(self.pid)

    def pids(self) -> list[int]:
        return tree_pids(self.pid)

    def log_tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if it did not exit."""
        p = self.process
        if p.poll() is not None:
            # It died on its own: keep its log and say where it is.
            log(f"{self.name} (pid {self.pid}) had exited with {p.returncode}; log kept at {self.log_path}")
            return p.returncode
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if os.environ.get("WATCHCACHE_BENCH_KEEP_LOGS"):
            log(f"{self.name} log: {self.log_path}")
        else:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return p.returncode


def _preexec() -> None:
    raise_nofile()


def start_process(name: str, cmd: Sequence[str], *, timeout: float = 180.0) -> Proc:
    """Start ``cmd`` (which must print the ready line), output to a temp log file; wait for the line."""
    fd, log = tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cwd = None
    if SRC:
        # PYTHONPATH first; and not the work tree as cwd, which ``python -m`` would put before it.
        env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
        cwd = "/"
    with os.fdopen(fd, "wb") as out:
        process = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            preexec_fn=_preexec,
        )
    path = Path(log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = READY.search(path.read_text(errors="replace"))
        if m:
            return Proc(name, process, m.group(1), path)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    text = path.read_text(errors="replace")
    if process.poll() is None:
        process.kill()
        process.wait()
    raise RuntimeError(f"{name} did not print its ready line:\n{text[-3000:]}")


def start_sim(*, objects: int, namespaces: int = 10, churn: float = 0.0, extra: Sequence[str] = ()) -> Proc:
    """``watchcache sim`` on a free port (its ready line is logged at INFO)."""
    cmd = [
        *watchcache_exe(),
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--objects",
        str(objects),
        "--namespaces",
        str(namespaces),
        "--churn",
        str(churn),
        *extra,
    ]
    return start_process("sim", cmd)


# Every benchmark client connects from 127.0.0.1: thousands of watches from one address.
LOCAL_CLIENTS = ("--max-connections-per-client", "0")


def start_proxy(upstream: str, *, extra: Sequence[str] = (), ready_timeout: float = 120.0) -> Proc:
    cmd = [*watchcache_exe(), "serve", "--listen", "127.0.0.1:0", "--upstream", upstream, *LOCAL_CLIENTS, *extra]
    proc = start_process("proxy", cmd)
    try:
        wait_ready(proc, ready_timeout)
    except BaseException:
        proc.stop()
        raise
    return proc


def start_embedded(*, objects: int, namespaces: int = 10, churn: float = 0.0, extra: Sequence[str] = ()) -> Proc:
    cmd = [
        *watchcache_exe(),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--sim-objects",
        str(objects),
        "--sim-namespaces",
        str(namespaces),
        "--sim-churn",
        str(churn),
        *LOCAL_CLIENTS,
        *extra,
    ]
    proc = start_process("embedded", cmd)
    try:
        wait_ready(proc, 300.0)
    except BaseException:
        proc.stop()
        raise
    return proc


def wait_ready(proc: Proc, timeout: float = 300.0) -> None:
    """Until ``/readyz`` answers 200 (every cache synced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(proc.url + "/readyz", timeout=2.0, context=client_tls()) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready after {timeout}s:\n{proc.log_tail()}")


def wait_objects(proc: Proc, resource: str, count: int, timeout: float = 300.0) -> dict[str, Any]:
    """Until ``/debug/cache`` shows at least ``count`` objects of ``resource``; returns its stats."""
    deadline = time.monotonic() + timeout
    stats: dict[str, Any] = {}
    while time.monotonic() < deadline:
        stats = get_json(proc.url + "/debug/cache")["resources"].get(resource, {})
        if stats.get("ready") and stats.get("objects", 0) >= count:
            return stats
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name}: {resource} has {stats.get('objects')} objects, wanted {count}")


def stop_all(procs: Iterable[Proc | None]) -> None:
    for p in procs:
        if p is not None:
            with contextlib.suppress(Exception):
                p.stop()


# ---------------------------------------------------------------- HTTP (cold paths)


def http(method: str, url: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
    """One request; https:// without verification, with the benchmark's bearer token if one is set."""
    headers = {"Content-Type": content_type}
    if _admin_token:
        headers["Authorization"] = f"Bearer {_admin_token}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120.0, context=client_tls()) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str) -> Any:
    status, body = http("GET", url)
    if status != 200:
        raise RuntimeError(f"GET {url}: {status} {body[:200]!r}")
    return json.loads(body)


def get_bytes(url: str) -> bytes:
    status, body = http("GET", url)
    if status != 200:
        raise RuntimeError(f"GET {url}: {status} {body[:200]!r}")
    return body


def make_stamp_pods(base: str, count: int, namespace: str = "ns-0", prefix: str = "bench-stamp") -> list[str]:
    """Create ``count`` pods (copies of an existing ~3 KB pod) that only the benchmark writes to.

    The sim's churn only touches pods that existed when it started, so these carry the
    benchmark's stamps and nothing else. Returns their names (existing ones are reused).
    """
    src = get_json(f"{base}/api/v1/namespaces/{namespace}/pods?limit=1&resourceVersion=0")["items"][0]
    names = []
    for i in range(count):
        pod = json.loads(json.dumps(src))
        meta = pod["metadata"]
        for k in ("uid", "resourceVersion", "creationTimestamp", "generateName", "ownerReferences"):
            meta.pop(k, None)
        meta["name"] = f"{prefix}-{i}"
        meta.setdefault("annotations", {})[STAMP_KEY] = "0000000000.000000"
        pod["kind"], pod["apiVersion"] = "Pod", "v1"
        status, body = http("POST", f"{base}/api/v1/namespaces/{namespace}/pods", json.dumps(pod).encode())
        if status not in (200, 201, 409):
            raise RuntimeError(f"create {meta['name']}: {status} {body[:300]!r}")
        names.append(meta["name"])
    return names


# ---------------------------------------------------------------- statistics and output


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``sorted_values`` sorted."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo))


def summarize(values: Iterable[float], scale: float = 1000.0) -> dict[str, float]:
    """n, p50, p90, p99, max of ``values`` (seconds), scaled (default: to milliseconds)."""
    v = sorted(values)
    out: dict[str, float] = {"n": len(v)}
    for name, p in (("p50", 50), ("p90", 90), ("p99", 99)):
        out[name] = round(percentile(v, p) * scale, 2) if v else float("nan")
    out["max"] = round(v[-1] * scale, 2) if v else float("nan")
    return out


def fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.2f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str = "") -> str:
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _json_safe(x: Any) -> Any:
    """NaN/inf (no sample, e.g. no stamp arrived in the window) become null: the line stays strict JSON."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def bench_line(name: str, payload: dict[str, Any]) -> None:
    """The final machine-readable line of every benchmark (strict JSON after ``BENCH ``)."""
    body = json.dumps(_json_safe({"bench": name, **payload}), separators=(",", ":"), default=str, allow_nan=False)
    print("BENCH " + body, flush=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- helper processes (orchestrator side)


class Helper:
    """A load-side process (``benchlib.py ROLE``) driven with JSON lines over stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, role: str) -> None:
        self.process = process
        self.role = role

    @classmethod
    async def start(cls, role: str, *args: str) -> Helper:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HERE / "benchlib.py"),
            role,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=_preexec,
            limit=64 << 20,
        )
        return cls(process, role)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def recv(self, timeout: float = 300.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.role} helper exited (rc={await self.process.wait()})")
        return json.loads(line)

    async def send(self, cmd: str, **kw: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cmd": cmd, **kw}).encode() + b"\n")
        await self.process.stdin.drain()

    async def ask(self, cmd: str, timeout: float = 300.0, **kw: Any) -> dict[str, Any]:
        await self.send(cmd, **kw)
        return await self.recv(timeout)

    async def close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(Exception):
                await self.send("quit")
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


# ---------------------------------------------------------------- helper processes (their side)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _rusage_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- watch-reader


class _ReaderState:
    def __init__(self, sample_every: int) -> None:
        self.buf = bytearray(256 * 1024)
        self.mv = memoryview(self.buf)
        self.frames = 0
        self.framing = 0
        self.bytes = 0
        self.established = 0
        self.failed = 0
        self.closed = 0
        self.sample_every = sample_every
        self.lat_since: float | None = None
        self.latencies: list[float] = []
        self.by_label: dict[str, list[float]] = {}
        self.bad_status: list[str] = []


class _WatchConn(asyncio.BufferedProtocol):
    """One watch: count frames (``}\\n``), optionally parse stamps. Nothing else is parsed."""

    __slots__ = (
        "carry",
        "done",
        "head",
        "label",
        "last",
        "probe_request",
        "probing",
        "request",
        "sampled",
        "st",
        "transport",
    )

    def __init__(
        self,
        st: _ReaderState,
        request: bytes,
        sampled: bool,
        done: asyncio.Future[bool],
        probe: bool = False,
        probe_request: bytes = b"GET /debug/shards HTTP/1.1\r\nHost: bench\r\n\r\n",
    ) -> None:
        self.st = st
        self.request = request
        self.probe_request = probe_request
        self.sampled = sampled
        self.done = done
        self.head: bytearray | None = bytearray()
        self.last = 0
        self.carry = b""
        # A sharded proxy: ask which worker holds this connection (keep-alive keeps it there).
        self.probing = probe
        self.label = "-"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.probing:
            transport.write(self.probe_request)  # type: ignore[attr-defined]
        else:
            transport.write(self.request)  # type: ignore[attr-defined]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.st.mv

    def _probe_answer(self) -> None:
        assert self.head is not None
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.head[:end])
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if m:
            size = int(m.group(1))
            if len(self.head) < end + 4 + size:
                return
            body = bytes(self.head[end + 4 : end + 4 + size])
        else:  # chunked (e.g. passed through to the upstream): wait for the last chunk
            tail = self.head.find(b"\r\n0\r\n\r\n", end)
            if tail < 0:
                return
            body = bytes(self.head[end + 4 : tail])
        w = re.search(rb'"worker":\s*(\d+)', body)
        self.label = f"worker {w.group(1).decode()}" if w else "-"
        self.probing = False
        self.head = bytearray()
        self.transport.write(self.request)  # type: ignore[attr-defined]

    def buffer_updated(self, nbytes: int) -> None:
        st = self.st
        if self.probing:
            assert self.head is not None
            self.head += st.buf[:nbytes]
            self._probe_answer()
            return
        if self.head is not None:
            self.head += st.buf[:nbytes]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self.head[: self.head.find(b"\r\n")])
            rest = bytes(self.head[end + 4 :])
            self.head = None
            if b" 200 " not in status:
                st.bad_status.append(status.decode(errors="replace"))
                st.failed += 1
                if not self.done.done():
                    self.done.set_result(False)
                self.transport.close()
                return
            st.established += 1
            if not self.done.done():
                self.done.set_result(True)
            if rest:
                self._body(rest, len(rest))
            return
        self._body(st.buf, nbytes)

    def _body(self, data: bytes | bytearray, n: int) -> None:
        st = self.st
        # Every frame ends with "}\n"; the chunked framing's newlines follow "\r" or a hex digit.
        # A find() loop (memchr) is ~9 GB/s here; bytes.count(b"}\n") only 0.5 GB/s.
        c = o = 0
        find = data.find
        i = find(b"\n", 0, n)
        while i != -1:
            if (data[i - 1] if i else self.last) == 125:
                c += 1
            else:
                o += 1  # chunk framing: 2 per chunk, i.e. per write of the server
            i = find(b"\n", i + 1, n)
        self.last = data[n - 1]
        st.frames += c
        st.framing += o
        st.bytes += n
        if self.sampled and st.lat_since is not None:
            now = time.time()
            carry = self.carry
            combined = carry + bytes(data[:n])
            i = combined.find(STAMP_MARK)
            while i != -1:
                start = i + len(STAMP_MARK)
                j = combined.find(b'"', start)
                if j == -1:
                    break
                if j >= len(carry):  # not already seen complete in the previous read
                    stamp = float(combined[start:j])
                    if stamp >= st.lat_since:
                        st.latencies.append(now - stamp)
                        st.by_label.setdefault(self.label, []).append(now - stamp)
                i = combined.find(STAMP_MARK, j)
            self.carry = combined[-64:]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head is None:
            self.st.closed += 1
        elif not self.done.done():
            self.st.failed += 1
            self.done.set_result(False)


async def _watch_reader(args: argparse.Namespace) -> None:
    import uvloop  # noqa: F401  (the loop policy is set in main)

    loop = asyncio.get_running_loop()
    st = _ReaderState(args.sample_every)
    request = (
        (
            f"GET {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\nAccept: application/json\r\n"
            "User-Agent: watchcache-bench\r\n"
        ).encode()
        + auth_header(args.token)
        + b"\r\n"
    )
    probe_request = b"GET /debug/shards HTTP/1.1\r\nHost: bench\r\n" + auth_header(args.probe_token) + b"\r\n"
    tls = client_tls() if args.tls else None
    conns: list[_WatchConn] = []
    sem = asyncio.Semaphore(args.connect_concurrency)

    async def one(i: int) -> None:
        async with sem:
            done: asyncio.Future[bool] = loop.create_future()
            sampled = args.sample_every > 0 and (i + args.offset) % args.sample_every == 0
            probe = sampled and args.probe_worker
            try:
                _, proto = await loop.create_connection(
                    lambda: _WatchConn(st, request, sampled, done, probe, probe_request), args.host, args.port, ssl=tls
                )
            except OSError as e:
                st.failed += 1
                st.bad_status.append(f"connect: {e}")
                return
            conns.append(proto)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), 60)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.connections)))
    _emit(
        {
            "event": "connected",
            "established": st.established,
            "failed": st.failed,
            "seconds": round(time.monotonic() - started, 3),
            "errors": st.bad_status[:5],
        }
    )
    commands = await _commands()
    while True:
        line = await commands.readline()
        if not line:
            break
        cmd = json.loads(line)
        what = cmd["cmd"]
        if what == "snap":
            _emit(
                {
                    "t": time.time(),
                    "frames": st.frames,
                    "chunks": st.framing // 2,
                    "bytes": st.bytes,
                    "closed": st.closed,
                    "established": st.established,
                    "cpu": _rusage_cpu(),
                }
            )
        elif what == "lat-start":
            st.latencies = []
            st.by_label = {}
            st.lat_since = float(cmd["since"])
            _emit({"ok": True})
        elif what == "lat-stop":
            st.lat_since = None
            _emit({"latencies": st.latencies, "by_label": st.by_label})
            st.latencies = []
            st.by_label = {}
        elif what == "quit":
            break
    for c in conns:
        with contextlib.suppress(Exception):
            c.transport.abort()  # type: ignore[attr-defined]


# ---- raw-fanout (the ceiling)


class _FanoutConn(asyncio.Protocol):
    __slots__ = ("paused", "pending", "pending_bytes", "req", "server", "transport")

    def __init__(self, server: _FanoutServer) -> None:
        self.server = server
        self.req = b""
        self.paused = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=256 * 1024, low=64 * 1024)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.req is None:
            return
        self.req += data
        if b"\r\n\r\n" not in self.req:
            return
        target = self.req.split(b" ", 2)[1]
        self.req = None  # type: ignore[assignment]
        if target.startswith(b"/control"):
            # /control?rate=R&stamp=S: (re)start generating at R events/s (0: stop); answers the counters.
            from urllib.parse import parse_qs, urlsplit

            q = parse_qs(urlsplit(target.decode()).query)
            if "rate" in q:
                self.server.set_rate(float(q["rate"][0]), float(q.get("stamp", ["0"])[0]))
            body = json.dumps(self.server.stats()).encode()
            self.transport.write(  # type: ignore[attr-defined]
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            self.transport.close()
            return
        self.transport.write(  # type: ignore[attr-defined]
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        self.server.conns.add(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.pending:
            self.server.flush_one(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)


class _FanoutServer:
    """Generates ``rate`` events/s in 10 ms ticks; each tick's frames go to each connection as ONE chunk.

    Idle until ``/control?rate=R`` (so watchers connect without load, as in the other variants).
    """

    def __init__(self, template: bytes, cap: int, join: bool = False) -> None:
        self.conns: set[_FanoutConn] = set()
        # Over TLS: each buffer handed to the transport becomes at least one TLS record (and one
        # SSL_write); a chunk's size line and CRLF would be records of a few bytes. Joined, the
        # chunk is one buffer the TLS layer cuts into full 16 KB records.
        self.join = join
        self.rate = 0.0
        self.stamp_every = 0.0
        self.cap = cap
        # A pod frame with a fixed-width stamp slot; unstamped frames carry a same-width filler key.
        obj = template
        marker = b'"' + STAMP_KEY.encode() + b'":"0000000000.000000"'
        if marker not in obj:
            raise SystemExit("template lacks the stamp annotation")
        head = b'{"type":"MODIFIED","object":'
        i = obj.index(marker) + len(STAMP_MARK)
        self.pre = head + obj[:i]
        self.post = obj[i + len("0000000000.000000") :] + b"}\n"
        self.plain = head + obj.replace(marker, b'"bench/written-xx":"0000000000.000000"') + b"}\n"
        self.frame_bytes = len(self.plain)
        self.generated = 0
        self.stamped = 0
        self.dropped = 0
        self.writes = 0
        self._last_stamp = 0.0
        self._wake = asyncio.Event()

    def set_rate(self, rate: float, stamp_rate: float) -> None:
        self.rate = rate
        self.stamp_every = 1.0 / stamp_rate if stamp_rate > 0 else 0.0
        self._wake.set()

    def stats(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "generated": self.generated,
            "stamped": self.stamped,
            "dropped": self.dropped,
            "writes": self.writes,
            "connections": len(self.conns),
            "frame_bytes": self.frame_bytes,
        }

    def _frames(self, n: int, due_at: list[float]) -> list[bytes]:
        """``n`` frames; ``due_at[i]``: when frame i was due (wall clock), the time a stamp carries.

        Stamping the due time, not the time the loop got round to building the frame, makes the
        ceiling's latency include its own queueing, as the proxy's does (its stamps are set by the
        writer before the upstream even sees the event).
        """
        frames = []
        for due in due_at:
            if self.stamp_every and due - self._last_stamp >= self.stamp_every:
                self._last_stamp = due
                frames.append(self.pre + b"%.6f" % due + self.post)  # built once, shared by all connections
                self.stamped += 1
            else:
                frames.append(self.plain)
        self.generated += n
        return frames

    def flush_one(self, c: _FanoutConn) -> None:
        parts = c.pending
        c.pending = []
        c.pending_bytes = 0
        self._write(c, parts)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.rate <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            rate = self.rate
            start = loop.time()
            wall_start = time.time()
            done = 0
            while self.rate == rate:
                due = int((loop.time() - start) * rate) - done
                limit = max(1, int(rate))
                if due > limit:  # as the sim's churn: more than a second behind is dropped, not replayed
                    done += due - limit
                    due = limit
                if due > 0:
                    due_at = [wall_start + (done + i + 1) / rate for i in range(due)]
                    done += due
                    self._send(self._frames(due, due_at))
                await asyncio.sleep(0.01)

    def _send(self, frames: list[bytes]) -> None:
        size = sum(map(len, frames))
        for c in self.conns:
            if c.paused:
                if c.pending_bytes + size > self.cap:
                    self.dropped += len(frames)
                    continue
                c.pending.extend(frames)
                c.pending_bytes += size
                continue
            if c.pending:
                c.pending.extend(frames)
                self.flush_one(c)
            else:
                self._write(c, frames)

    def _write(self, c: _FanoutConn, parts: list[bytes]) -> None:
        chunk = [b"%x\r\n" % sum(map(len, parts)), *parts, b"\r\n"]
        if self.join:
            c.transport.write(b"".join(chunk))  # type: ignore[attr-defined]
        else:
            c.transport.writelines(chunk)  # type: ignore[attr-defined]
        self.writes += 1


async def _raw_fanout(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    template = Path(args.template).read_bytes()
    tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    server = _FanoutServer(template, args.cap, join=tls is not None and not args.no_join)
    srv = await loop.create_server(lambda: _FanoutConn(server), "127.0.0.1", 0, backlog=4096, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    gen = asyncio.ensure_future(server.run())
    print(f"raw-fanout ready: listening on {'https' if tls else 'http'}://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    gen.cancel()
    print(json.dumps(server.stats()), flush=True)


# ---- raw-list (the ceiling)


class _ListConn(asyncio.Protocol):
    """Answers GETs from ``responses``: all at once with ``writelines`` (plain), or paced (``pump``).

    Paced (the TLS ceiling): the buffers go to the transport until it is over its high-water mark,
    the rest when it resumes, as the proxy's ``send_stream`` slices a large body: the TLS layer then
    never holds (and copies) a whole 30 MB body at once.
    """

    __slots__ = ("buf", "paused", "pump", "queue", "responses", "transport")

    def __init__(self, responses: dict[bytes, list[bytes]], pump: bool = False) -> None:
        self.responses = responses
        self.buf = b""
        self.pump = pump
        self.paused = False
        self.queue: collections.deque[bytes] = collections.deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()

    def _pump(self) -> None:
        queue, write = self.queue, self.transport.write  # type: ignore[attr-defined]
        while queue and not self.paused:
            write(queue.popleft())

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            target = head.split(b" ", 2)[1]
            parts = self.responses.get(target)
            if parts is None:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")  # type: ignore[attr-defined]
                continue
            size = sum(map(len, parts))
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
                b"Content-Length: %d\r\n\r\n" % size
            )
            if self.pump:
                self.queue.append(head)
                self.queue.extend(parts)
                self._pump()
            else:
                self.transport.writelines([head, *parts])  # type: ignore[attr-defined]


async def _raw_list(args: argparse.Namespace) -> None:
    """Serves the LIST bodies in ``args.bodies`` (JSON: target -> body file) as per-item buffers."""
    import orjson

    loop = asyncio.get_running_loop()
    spec = json.loads(Path(args.bodies).read_text())
    responses: dict[bytes, list[bytes]] = {}
    for target, path in spec.items():
        body = Path(path).read_bytes()
        doc = orjson.loads(body)
        items = doc.pop("items")
        env = orjson.dumps(doc)[:-1] + b',"items":['
        parts = [env]
        sep = b"{"
        for item in items:
            parts.append(sep)
            parts.append(orjson.dumps(item)[1:])  # cached per-item bytes, as the proxy keeps them
            sep = b",{"
        parts.append(b"]}")
        if sum(map(len, parts)) != len(body):
            print(f"warning: re-encoded {target} is {sum(map(len, parts))} bytes, proxy's {len(body)}", file=sys.stderr)
        responses[target.encode()] = parts
    tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    if tls is not None and not args.no_join:
        # Over TLS each buffer is one SSL_write and at least one record: pre-join the items into
        # 64 KB buffers (full 16 KB records), the best a bare server can hand the TLS layer.
        responses = {t: regroup(parts, 64 << 10) for t, parts in responses.items()}
    pump = tls is not None and not args.no_join
    srv = await loop.create_server(lambda: _ListConn(responses, pump), "127.0.0.1", 0, backlog=4096, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    print(f"raw-list ready: listening on {'https' if tls else 'http'}://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def regroup(parts: list[bytes], size: int) -> list[bytes]:
    """``parts`` joined into buffers of at least ``size`` bytes (the last one may be shorter)."""
    out: list[bytes] = []
    group: list[bytes] = []
    n = 0
    for part in parts:
        group.append(part)
        n += len(part)
        if n >= size:
            out.append(b"".join(group))
            group, n = [], 0
    if group:
        out.append(b"".join(group))
    return out


# ---- list-client


class _ListClientConn(asyncio.BufferedProtocol):
    """Keep-alive LIST requests back to back; reads whole bodies, keeps only the first 4 KB."""

    def __init__(self, buf: bytearray, host: str, token: str = "") -> None:
        self.buf = buf
        self.mv = memoryview(buf)
        self.host = host
        self.auth = auth_header(token)
        self.head = bytearray()
        self.remaining = -1
        self.first = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, int]] | None = None
        self.status = 0
        self.size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def request(self, target: str) -> asyncio.Future[tuple[int, bytes, int]]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.head = bytearray()
        self.remaining = -1
        self.first = bytearray()
        self.transport.write(  # type: ignore[attr-defined]
            f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\nAccept: application/json\r\n".encode() + self.auth + b"\r\n"
        )
        return self.waiter

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.mv

    def buffer_updated(self, nbytes: int) -> None:
        data = self.mv[:nbytes]
        if self.remaining < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).lower()
            self.status = int(head.split(b" ", 2)[1])
            m = re.search(rb"content-length: *(\d+)", head)
            self.size = self.remaining = int(m.group(1)) if m else 0
            data = memoryview(bytes(self.head[end + 4 :]))
            self.head = bytearray()
        if len(self.first) < 4096:
            self.first += data[: 4096 - len(self.first)]
        self.remaining -= len(data)
        if self.remaining <= 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.status, bytes(self.first), self.size))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))


_CONTINUE = re.compile(rb'"continue":"([^"]*)"')


async def _list_run(conns: list[_ListClientConn], cmd: dict[str, Any]) -> dict[str, Any]:
    """LISTs back to back on every connection for ``duration`` s: one request, or pages until no continue."""
    from urllib.parse import quote

    first = cmd["first"]
    paged = cmd["paged"]
    page_prefix = cmd.get("page_prefix", "")
    deadline = time.monotonic() + cmd["duration"]
    req_lat: list[float] = []
    list_lat: list[float] = []
    errors: list[str] = []
    nbytes = 0
    cpu0 = _rusage_cpu()

    async def worker(c: _ListClientConn) -> None:
        nonlocal nbytes
        while time.monotonic() < deadline:
            t_list = time.perf_counter()
            target = first
            while True:
                t0 = time.perf_counter()
                try:
                    status, head, size = await c.request(target)
                except ConnectionError as e:
                    errors.append(str(e))
                    return
                req_lat.append(time.perf_counter() - t0)
                nbytes += size
                if status != 200:
                    errors.append(f"{status}: {head[:200]!r}")
                    return
                if not paged:
                    break
                m = _CONTINUE.search(head)
                if not m or not m.group(1):
                    break
                target = page_prefix + quote(m.group(1).decode(), safe="")
            list_lat.append(time.perf_counter() - t_list)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    return {
        "elapsed": time.perf_counter() - t0,
        "requests": len(req_lat),
        "lists": len(list_lat),
        "bytes": nbytes,
        "req_lat": req_lat,
        "list_lat": list_lat,
        "errors": errors[:5],
        "cpu": _rusage_cpu() - cpu0,
    }


async def _list_client(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    buf = bytearray(1 << 20)
    conns = []
    for _ in range(args.connections):
        _, proto = await loop.create_connection(
            lambda: _ListClientConn(buf, f"{args.host}:{args.port}", args.token),
            args.host,
            args.port,
            ssl=client_tls() if args.tls else None,
        )
        conns.append(proto)
    _emit({"event": "connected", "connections": len(conns)})
    commands = await _commands()
    while True:
        line = await commands.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        _emit(await _list_run(conns, cmd))
    for c in conns:
        c.transport.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- main (helper roles)


def main(argv: list[str] | None = None) -> None:
    import uvloop

    raise_nofile()
    p = argparse.ArgumentParser(description="load-side helper processes for loadtest/bench_*.py")
    sub = p.add_subparsers(dest="role", required=True)
    r = sub.add_parser("watch-reader")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--path", required=True)
    r.add_argument("--connections", type=int, required=True)
    r.add_argument("--sample-every", type=int, default=0, help="parse stamps on every Nth connection (0: none)")
    r.add_argument("--offset", type=int, default=0)
    r.add_argument("--connect-concurrency", type=int, default=100)
    r.add_argument(
        "--probe-worker", action="store_true", help="sampled connections ask /debug/shards which worker serves them"
    )
    r.add_argument("--tls", action="store_true", help="connect with TLS (no verification)")
    r.add_argument("--token", default="", help="bearer token of the watch requests")
    r.add_argument("--probe-token", default="", help="bearer token of the /debug/shards probes")
    f = sub.add_parser("raw-fanout")
    f.add_argument("--template", required=True)
    f.add_argument("--cap", type=int, default=16 << 20)
    f.add_argument("--no-join", action="store_true", help="over TLS: writelines the chunk's parts, as plain HTTP")
    rl = sub.add_parser("raw-list")
    rl.add_argument("--bodies", required=True)
    rl.add_argument("--no-join", action="store_true", help="over TLS: writelines the per-item buffers, as plain HTTP")
    for server in (f, rl):
        server.add_argument("--tls-cert", default="", help="serve TLS with this certificate (PEM)")
        server.add_argument("--tls-key", default="")
    lc = sub.add_parser("list-client")
    lc.add_argument("--host", default="127.0.0.1")
    lc.add_argument("--port", type=int, required=True)
    lc.add_argument("--connections", type=int, default=4)
    lc.add_argument("--tls", action="store_true")
    lc.add_argument("--token", default="")
    args = p.parse_args(argv)
    role = {
        "watch-reader": _watch_reader,
        "raw-fanout": _raw_fanout,
        "raw-list": _raw_list,
        "list-client": _list_client,
    }[args.role]
    uvloop.run(role(args))


if __name__ == "__main__":
    main()

"""The orchestrator's library for the hot-path benchmarks (``python -m loadtest.bench.<name>``).

* process management: start ``watchcache sim`` / ``watchcache serve`` on port 0, parse the
  ``ready: listening on http://…`` line, wait for ``/readyz``, stop with SIGTERM;
* ``/proc`` readings: RSS (VmRSS) and CPU seconds of a process;
* percentiles, tables and the final ``BENCH {json}`` line;
* starting the load-side processes the benchmarks run next to the system under test, one module
  each, so that they never share a core's event loop with the orchestrator
  (``python -m loadtest.bench.ROLE``, see :func:`python_m`):

  - ``watch_reader``: N watch connections on raw sockets, counting frames, timing stamps;
  - ``raw_fanout``: the fan-out ceiling, a bare uvloop server writing pre-built watch frames;
  - ``raw_list``: the LIST ceiling, a bare uvloop server answering with pre-encoded bytes;
  - ``list_client``: C keep-alive connections issuing LISTs (full or paged) back to back;
  - ``busy_writer``: writes elsewhere at a rate, moving the upstream's rv (``consistent_reads``);
  - ``flood``: one flow's back-to-back reads, counted by status (``noisy_neighbour``).

  The driven ones talk to the orchestrator (:class:`Helper`) with one JSON object per line on
  stdin/stdout (their side: ``helperio``).

  With ``--tls`` (clients) / ``--tls-cert`` and ``--tls-key`` (ceilings) they speak TLS, and clients
  send ``--token`` as a bearer token: the production configuration (``Production``,
  ``add_production_flags``, ``ProductionFiles``: certificate, token file, the sim's policy).

Nothing here imports ``watchcache``: the benchmarks drive the real processes over HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness.processes

ROOT = Path(__file__).resolve().parents[2]
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


def schedstat(pids: list[int]) -> tuple[float, float]:
    """(on a CPU, runnable but waiting for one) seconds so far, summed over ``pids``' threads: a process
    that waits for a CPU as long as it runs is short of cores, not of its own capacity."""
    ran = waited = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    fields = f.read().split()
            except OSError:
                continue
            ran += int(fields[0])
            waited += int(fields[1])
    return ran / 1e9, waited / 1e9


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


def python_m(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS``, e.g. ``python_m("loadtest.bench.raw_list", …)``; start it with :func:`child_env`."""
    return harness.processes.python_m(module, *args)


def child_env(src: str | None = None) -> tuple[dict[str, str], str | None]:
    """The environment and working directory of a child process: ``loadtest`` importable from any
    directory (the repository on ``PYTHONPATH``); with ``WATCHCACHE_BENCH_SRC`` (or ``src``: "" for
    the work tree), that copy of ``watchcache`` first, and not the work tree as cwd, which ``python
    -m`` would put before it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # As deployed, where the image's pip install compiled every module: with PYTHONDONTWRITEBYTECODE
    # (this workplace sets it) and no .pyc files, each start would compile ~170 modules anew (0.3 s of
    # CPU here), which a start-up figure would count.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    path = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    cwd = None
    src = SRC if src is None else src
    if src:
        path.insert(0, src)
        cwd = "/"
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env, cwd


class Proc(harness.processes.Proc):
    """A started ``watchcache`` process (or any process that prints the ready line), with the readings
    a benchmark takes of it and its children (workers)."""

    def cpu(self) -> float:
        """CPU seconds of the process and its children (workers)."""
        return tree_cpu_seconds(self.pid)

    def rss(self) -> int:
        """VmRSS of the process and its children (workers), summed."""
        return tree_rss_bytes(self.pid)

    def pids(self) -> list[int]:
        return tree_pids(self.pid)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if it did not exit; a process that died on its own keeps its log."""
        if self.process is not None and self.process.poll() is not None:
            log(f"{self.name} (pid {self.pid}) had exited with {self.process.returncode}; log kept at {self.log_path}")
        elif os.environ.get("HARNESS_KEEP_LOGS"):
            log(f"{self.name} log: {self.log_path}")
        return super().stop(timeout)


# Every process a bench starts (a proxy and its workers, a load-side helper) has a session of its
# own, as kube-apiserver and etcd of the reference kit have theirs (start.sh). With autogroup
# scheduling (Linux's default, on here: /proc/sys/kernel/sched_autogroup_enabled) a session is a
# scheduling group, as a Pod's cgroup is in a cluster; in the bench's session, the proxy and the
# writer moving the rv shared the timed client's group, and so its share of the cores, which a
# request sent directly does not pay (docs/performance.md, "Each process in a group of its own").
# Out of the bench's process group, a child no longer dies with it (a ^C, a `timeout`, a `kill` of
# the bench, its crash), so each asks for SIGTERM when the bench dies
# (`harness.processes.dies_with_parent`), which the proxy answers with its graceful stop.


def child_preexec() -> Callable[[], None]:
    """A ``preexec_fn`` for a bench's child: the open-files limit raised, and SIGTERM when the bench
    dies (from the main thread only: ``harness.processes.dies_with_parent``)."""
    return harness.processes.dies_with_parent(raise_nofile)


def start_process(name: str, cmd: Sequence[str], *, timeout: float = 180.0, src: str | None = None) -> Proc:
    """Start ``cmd`` (which must print the ready line), output to a temp log file; wait for the line.
    ``src``: the copy of ``watchcache`` it runs (``child_env``)."""
    env, cwd = child_env(src)
    proc = Proc(list(cmd), name=name, env=env, cwd=cwd, preexec=child_preexec(), new_session=True)
    proc.up(timeout)
    return proc


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
        "--simulated",
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
    harness.processes.wait_ready(proc, timeout, context=client_tls())


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
    for error in harness.processes.stop_all(procs):
        log(f"stopping: {error}")


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
    """A load-side process (``python -m loadtest.bench.ROLE``) driven with JSON lines over stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, role: str) -> None:
        self.process = process
        self.role = role

    @classmethod
    async def start(cls, role: str, *args: str) -> Helper:
        """``role``: ``watch-reader`` or ``list-client`` (the module ``loadtest.bench.watch_reader``, …)."""
        env, cwd = child_env()
        process = await asyncio.create_subprocess_exec(
            *python_m(f"loadtest.bench.{role.replace('-', '_')}", *args),
            env=env,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=child_preexec(),
            start_new_session=True,
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


async def ask_all(helpers: Sequence[Helper], cmd: str, timeout: float = 600.0, **kw: Any) -> list[dict[str, Any]]:
    """Send ``cmd`` to every helper first, then collect their answers (they work at the same time)."""
    for h in helpers:
        await h.send(cmd, **kw)
    return [await h.recv(timeout) for h in helpers]

"""Run a locust profile against watchcache and report it: ``python -m loadtest.locust.run --help``.

    python -m loadtest.locust.run --profile steady --users 20 --spawn-rate 10 --duration 30s
        [--target URL] [--token T] [--start-stack [--listen HOST:PORT] [--sim-listen HOST:PORT]]

With ``--start-stack`` it starts ``watchcache demo`` (simulated cluster + proxy) on free ports (or
``--listen``/``--sim-listen``) and stops it afterwards; otherwise it targets ``--target`` (default:
``make run``'s proxy). Locust runs in a subprocess (headless, or its web UI with ``--ui``)
writing ``REPORTS/<profile>_*.csv`` and ``<profile>.html``; then this writes ``<profile>.png``
(delivery latency and throughput over time) and prints a summary (also in
``<profile>_summary.txt``) and the list of the run's reports. Exit status: 0 when locust
succeeded with no failed request. Arguments after ``--`` go to locust unchanged.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest.locust import report, stack
from loadtest.locust.config import PROFILES

_REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = _REPO / "loadtest" / "locust" / "locustfile.py"
DEFAULT_REPORTS = _REPO / "loadtest" / "reports"
DEFAULT_TARGET = "http://127.0.0.1:8080"
LOCUST_GRACE = 90.0  # seconds beyond --duration before the locust process is considered hung


def parse_duration(text: str) -> float:
    """locust's format: ``30``, ``30s``, ``2m``, ``1h30m``."""
    if text.isdigit():
        return float(text)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not parts or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 2m, 1h30m)")
    h, m, s = (int(g or 0) for g in parts.groups())
    return float(h * 3600 + m * 60 + s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.locust.run",
        description="Run a locust load profile against watchcache and summarise it.",
        epilog="Arguments after -- are passed to locust.",
    )
    p.add_argument("--profile", choices=PROFILES, default="steady", help="load profile (default %(default)s)")
    p.add_argument("--users", type=int, default=20, help="peak users, the writer included (default %(default)s)")
    p.add_argument("--spawn-rate", type=float, default=10.0, help="users started per second (default %(default)s)")
    p.add_argument("--duration", default="30s", help="run time, e.g. 30s, 2m (default %(default)s)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="the API to load: proxy or apiserver (default %(default)s)")
    p.add_argument(
        "--token",
        default=os.environ.get("WATCHCACHE_LT_TOKEN", ""),
        help="bearer token (default: $WATCHCACHE_LT_TOKEN); passed to locust in the environment, not argv",
    )
    p.add_argument("--start-stack", action="store_true", help="start `watchcache demo` on free ports and target it")
    p.add_argument("--listen", default="", help="--start-stack: the proxy's HOST:PORT (default: a free port)")
    p.add_argument("--sim-listen", default="", help="--start-stack: the simulated cluster's HOST:PORT (default: free)")
    p.add_argument("--upstream-host", default="", help="the proxy's upstream, for its counters (set by --start-stack)")
    p.add_argument("--writes-via", choices=("proxy", "upstream"), default="proxy", help="where ChurnUser writes")
    p.add_argument("--churn-rate", type=float, default=10.0, help="writes/s of the writer (default %(default)s)")
    p.add_argument("--namespaces", default="", help="namespaces to read, comma-separated (default: discovered)")
    p.add_argument("--churn-namespaces", default="", help="namespaces to write configmaps in (default: derived)")
    p.add_argument("--objects", type=int, default=1000, help="--start-stack: pods (default %(default)s)")
    p.add_argument("--stack-namespaces", type=int, default=10, help="--start-stack: namespaces (default %(default)s)")
    p.add_argument(
        "--stack-churn", type=float, default=5.0, help="--start-stack: the sim's pod writes/s (default %(default)s)"
    )
    p.add_argument("--reports-dir", type=Path, default=DEFAULT_REPORTS, help="default loadtest/reports")
    p.add_argument("--ui", action="store_true", help="locust's web UI instead of a headless run (Ctrl-C to end)")
    p.add_argument("--web-port", type=int, default=8089, help="--ui: the web UI's port (default %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p


def locust_command(args: argparse.Namespace, target: str, upstream: str, prefix: Path, extra: list[str]) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--host",
        target,
        "--users",
        str(args.users),
        "--spawn-rate",
        str(args.spawn_rate),
        "--run-time",
        args.duration,
        "--csv",
        str(prefix),
        "--csv-full-history",
        "--html",
        f"{prefix}.html",
        "--load-profile",
        args.profile,
        "--churn-rate",
        str(args.churn_rate),
        "--writes-via",
        args.writes_via,
    ]
    if upstream:
        cmd += ["--upstream-host", upstream]
    if args.namespaces:
        cmd += ["--namespaces", args.namespaces]
    if args.churn_namespaces:
        cmd += ["--churn-namespaces", args.churn_namespaces]
    if args.ui:
        cmd += ["--web-host", "127.0.0.1", "--web-port", str(args.web_port)]
    else:
        cmd += ["--headless", "--only-summary"]
    return cmd + extra


def run_locust(cmd: list[str], token: str, timeout: float | None, log_path: Path | None) -> int:
    """Run locust; its output goes to ``log_path`` (headless) or the terminal (``log_path`` None)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if token:
        env["WATCHCACHE_LT_TOKEN"] = token
    log = log_path.open("w") if log_path else None
    process = subprocess.Popen(cmd, cwd=_REPO, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"run.py: locust still running after {timeout:.0f} s; stopping it", file=sys.stderr)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
    except (KeyboardInterrupt, Terminated):
        process.send_signal(signal.SIGINT)  # locust writes its reports on the way out
        try:
            return process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
    finally:
        if log is not None:
            log.close()


def _errors(path: Path, lines: int = 20) -> str:
    """The load test's own error lines if any (they say why), else the end of the log."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    ours = [line for line in text if "/ERROR/loadtest" in line]
    return "\n".join(ours[:lines] or text[-lines:])


# What a run leaves, in the order worth reading: the summary and the plot first, the raw data, the logs.
REPORT_SUFFIXES = (
    "_summary.txt",
    ".png",
    ".html",
    "_stats.csv",
    "_stats_history.csv",
    "_failures.csv",
    "_exceptions.csv",
    "_extras.json",
    "_locust.log",
    "_stack.log",
)


def report_files(prefix: Path) -> list[Path]:
    """Every file of this run's reports that exists (no PNG without matplotlib, no stack log without one)."""
    return [path for path in (Path(f"{prefix}{suffix}") for suffix in REPORT_SUFFIXES) if path.exists()]


class Terminated(Exception):
    """SIGTERM: unwind like Ctrl-C so that locust and the stack are stopped, not orphaned."""


def _on_sigterm(signum: int, frame: object) -> None:
    # Once: a second SIGTERM (``timeout`` signals the whole group) must not cut the cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    args = build_parser().parse_args(argv)
    duration = parse_duration(args.duration)
    args.reports_dir.mkdir(parents=True, exist_ok=True)
    prefix = args.reports_dir / args.profile
    for old in [*args.reports_dir.glob(f"{args.profile}_*"), Path(f"{prefix}.png"), Path(f"{prefix}.html")]:
        old.unlink(missing_ok=True)  # a previous run's files would be listed as this run's

    running: stack.Stack | None = None
    target, upstream = args.target, args.upstream_host
    started = time.monotonic()
    try:
        if args.start_stack:
            running = stack.start(
                objects=args.objects,
                namespaces=args.stack_namespaces,
                churn=args.stack_churn,
                log_file=Path(f"{prefix}_stack.log"),
                listen=args.listen,
                sim_listen=args.sim_listen,
            )
            target, upstream = running.proxy_url, upstream or running.upstream_url
            print(f"run.py: stack ready in {time.monotonic() - started:.1f} s: proxy {target}, upstream {upstream}")
        cmd = locust_command(args, target, upstream, prefix, extra)
        log_path = None if args.ui else Path(f"{prefix}_locust.log")
        if log_path is not None:
            print(f"run.py: locust, profile {args.profile}, {args.users} users for {args.duration} (log: {log_path})")
        code = run_locust(cmd, args.token, None if args.ui else duration + LOCUST_GRACE, log_path)
        if code and log_path is not None:
            print(f"run.py: locust exited with {code}; from its log:\n{_errors(log_path)}", file=sys.stderr)
    finally:
        if running is not None:
            running.stop()
    if not Path(f"{prefix}_stats.csv").exists() or (code and not report.figures(report.read_stats(prefix)).requests):
        print("run.py: locust made no request", file=sys.stderr)
        return code or 1

    title = f"watchcache {args.profile}: {args.users} users, {args.duration}, {target}"
    if not args.no_plot:
        try:
            png = report.plot(prefix, Path(f"{prefix}.png"), title)
            print(f"run.py: plot {png}")
        except ImportError:
            print("run.py: no plot (matplotlib is not installed)", file=sys.stderr)
        except ValueError as e:
            print(f"run.py: no plot ({e})", file=sys.stderr)
    text = report.summary(prefix, f"== {title}")
    Path(f"{prefix}_summary.txt").write_text(text + "\n")
    print(text)
    print("reports: " + ", ".join(str(p) for p in report_files(prefix)))
    failures = report.figures(report.read_stats(prefix)).failures
    return code or (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())

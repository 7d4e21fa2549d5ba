"""A short headless locust run of the steady profile against a real stack, judged by its CSV.

Locust (and gevent's monkey patching) never runs in the pytest process: the stack is
``watchcache demo`` in a subprocess (``loadtest.locust.stack``) and the load is ``python -m loadtest.locust.run`` in
another, which runs locust in a third.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.locust import report, stack

REPO = Path(__file__).resolve().parents[2]
RUN_SECONDS = 10


@pytest.fixture
def small_stack() -> Iterator[stack.Stack]:
    running = stack.start(objects=300, namespaces=3, churn=5.0, timeout=60.0)
    yield running
    running.stop()


@pytest.mark.timeout(120)
def test_steady_run_has_traffic_timed_events_and_no_failures(small_stack: stack.Stack, tmp_path: Path) -> None:
    # One test, one run: split in two, xdist could run two locust runs at once.
    cmd = [
        sys.executable,
        "-m",
        "loadtest.locust.run",
        "--profile",
        "steady",
        "--users",
        "8",
        "--spawn-rate",
        "8",
        "--duration",
        f"{RUN_SECONDS}s",
        "--target",
        small_stack.proxy_url,
        "--upstream-host",
        small_stack.upstream_url,
        "--reports-dir",
        str(tmp_path),
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_SECONDS + 60)
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    prefix = tmp_path / "steady"
    assert done.returncode == 0, output + (tmp_path / "steady_locust.log").read_text(errors="replace")[-4000:]

    rows = report.read_stats(prefix)
    fig = report.figures(rows)
    assert fig.requests > 0
    assert fig.failures == 0, report.read_failures(prefix)
    assert fig.events > 0, "no watch event was delivered"
    assert fig.list_rps > 0 and any(r.type == "LIST" and r.requests for r in rows)
    assert fig.get_rps > 0 and any(r.type == "GET" and r.requests for r in rows)
    assert fig.write_rps > 0
    # The summary run.py printed states the same figures.
    assert "failures 0" in output and "delivery latency" in output
    assert elapsed < RUN_SECONDS + 20, f"the run took {elapsed:.0f} s"

    extras = json.loads(Path(f"{prefix}_extras.json").read_text())
    timed = extras["delivery_latency_ms"]["all"]
    assert timed["count"] > 0 and 0 <= timed["p50"] <= timed["p99"]
    assert extras["counters"].get("gaps and duplicates", 0) == 0
    upstream = extras["server_counters"]["after"]["upstream"]
    assert upstream is not None and upstream["passed_through"].get("write", 0) > 0  # the writes reached the sim
    plotted = importlib.util.find_spec("matplotlib") is not None
    if plotted:
        assert Path(f"{prefix}.png").stat().st_size > 10_000
    assert Path(f"{prefix}.html").exists()
    # The list printed at the end names every report, the summary and the plot first.
    listed = next(line for line in done.stdout.splitlines() if line.startswith("reports: "))[len("reports: ") :]
    wanted = [f"{prefix}_summary.txt", *([f"{prefix}.png"] if plotted else []), f"{prefix}.html"]
    assert listed.split(", ")[: len(wanted)] == wanted, listed
    assert f"{prefix}_stats.csv" in listed and f"{prefix}_extras.json" in listed

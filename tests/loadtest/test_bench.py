"""The production-configuration flags of the hot-path benchmarks and the helpers their ceilings use."""

from __future__ import annotations

import argparse
import os
import ssl
import time
from pathlib import Path

import pytest

from loadtest.bench import lib as bl
from loadtest.bench.fanout import follower_ratio
from loadtest.bench.raw_list import regroup
from tests.support.orphans import child_outlives_a_killed_parent


def parse(*argv: str) -> bl.Production:
    p = argparse.ArgumentParser()
    bl.add_production_flags(p)
    return bl.production_from_args(p.parse_args(list(argv)))


@pytest.mark.parametrize(
    ("argv", "expected", "label"),
    [
        pytest.param([], bl.Production(), "http+wdefault", id="plain"),
        pytest.param(["--tls"], bl.Production(tls=True), "tls+wdefault", id="tls"),
        pytest.param(
            ["--authentication", "delegated", "--workers", "1"],
            bl.Production(authentication="delegated", workers=1),
            "http+delegated+w1",
            id="delegated-one-worker",
        ),
        pytest.param(
            ["--production"], bl.Production(tls=True, authentication="delegated"), "tls+delegated+wdefault", id="prod"
        ),
    ],
)
def test_flags_give_the_configuration(argv: list[str], expected: bl.Production, label: str) -> None:
    prod = parse(*argv)
    assert prod == expected
    assert prod.label == label


def test_proxy_flags_follow_the_configuration(tmp_path) -> None:
    files = bl.ProductionFiles(any_delegated=True, any_tls=True)
    try:
        assert files.cert is not None and files.cert[0].exists() and files.cert[1].exists()
        prod = files.proxy_flags(bl.Production(tls=True, authentication="delegated", workers=2))
        assert prod[prod.index("--authentication") + 1] == "delegated"
        assert prod[prod.index("--workers") + 1] == "2"
        assert "--tls-cert-file" in prod and "--token-file" in prod
        # The plain baseline of the same run: no TLS, no authentication, but the proxy's identity
        # at a sim that enforces its policy.
        plain = files.proxy_flags(bl.Production())
        assert "--tls-cert-file" not in plain and "--authentication" not in plain and "--workers" not in plain
        assert "--token-file" in plain
        assert files.sim_flags() == ["--policy-file", str(bl.POLICY_FILE)]
        assert files.client_token == bl.CLIENT_TOKEN
        # The certificate loads into the ceilings' server context.
        assert isinstance(bl.server_tls(str(files.cert[0]), str(files.cert[1])), ssl.SSLContext)
    finally:
        files.cleanup()
        bl._admin_token = ""
    assert not files.dir.exists()


def test_regroup_joins_into_buffers_of_at_least_the_size() -> None:
    parts = [b"a" * 3, b"b" * 5, b"c" * 2, b"d" * 7, b"e"]
    out = regroup(parts, 8)
    assert b"".join(out) == b"".join(parts)
    assert [len(x) for x in out] == [8, 9, 1]


def test_follower_ratio_is_the_slowest_follower_over_the_owner() -> None:
    by_worker = {"worker 0": {"p50": 10.0}, "worker 1": {"p50": 25.0}, "worker 2": {"p50": 12.0}}
    assert follower_ratio(by_worker, 0) == 2.5
    assert follower_ratio(by_worker, None) is None
    assert follower_ratio({"worker 0": {"p50": 10.0}}, 0) is None


def test_writer_reads_chunked_answers_whole() -> None:
    """kube-apiserver answers a PATCH of a 2 KB object chunked; the writer must consume every chunk."""
    import asyncio

    from loadtest.bench.fanout import _read_chunked

    async def run() -> tuple[bytes, bytes]:
        r = asyncio.StreamReader()
        r.feed_data(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n")
        return await _read_chunked(r), await r.readuntil(b"\r\n")

    body, following = asyncio.run(run())
    assert body == b"hello world"
    assert following == b"HTTP/1.1 200 OK\r\n"  # the next answer is left intact


def test_fanout_cm_counts_the_upstreams_fanout_apart_from_its_writes(capsys) -> None:
    """kube-apiserver's fan-out CPU = its CPU in the direct round minus its CPU in the proxy rounds."""
    from loadtest.bench.fanout_cm import report

    def row(variant: str, server: float, upstream: float | None, delivered: int, missing: int = 0) -> dict:
        cpu = {"server": server} | ({"upstream": upstream} if upstream is not None else {})
        r = {
            "variant": variant,
            "server_cpu": cpu,
            "delivered_s": delivered,
            "delivered_fraction": 1.0,
            "us_cpu_per_delivery": round(server / delivered * 1e6, 2),
            "latency_ms": {"p50": 10.0, "p99": 50.0 if variant != "direct" else 100.0},
            "frames_per_write": 1.0,
            "load_avg_1m": 1.0,
        }
        if variant != "ceiling-tls":
            r["exact"] = {"missing": missing, "extra": 0, "ok": missing == 0}
        return r

    results = [
        row("ceiling-tls", 0.4, None, 100_000),
        row("proxy", 0.45, 0.3, 100_000),
        row("proxy-w1", 0.6, 0.5, 100_000, missing=3),
        row("direct", 1.4, 1.4, 100_000),
    ]
    args = argparse.Namespace(watchers=1000, rate=100.0, upstream="kube")
    goals = report(results, args)
    # Base: the median of the proxy rounds' upstream CPU (0.3, 0.5) = 0.4 core; fan-out 1.0 core / 100k = 10 µs.
    assert results[-1]["us_fanout_per_delivery"] == 10.0
    assert goals["proxy_cpu_vs_upstream_fanout"] == {"goal": "<= 0.5", "measured": 0.45, "met": True}
    assert goals["proxy_cpu_vs_ceiling_tls"]["measured"] == 1.125
    assert goals["proxy_p99_vs_upstream"]["met"] is True
    assert goals["proxy-w1_missing"] == {"goal": "0 missing, 0 extra", "measured": 3, "met": False}
    assert "3/0 FAIL" in capsys.readouterr().out


def test_schedstat_counts_a_processs_cpu() -> None:
    ran0, waited0 = bl.schedstat([os.getpid()])
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    ran1, waited1 = bl.schedstat([os.getpid()])
    assert ran1 - ran0 >= 0.04 and waited1 >= waited0 >= 0
    assert bl.schedstat([2**22 + 12345]) == (0.0, 0.0)  # gone: nothing, no error


def test_a_benchs_child_in_a_session_of_its_own_dies_with_the_bench() -> None:
    """A child in a session of its own is out of the bench's process group, so a kill of the bench
    (SIGKILL here, as a crash: no cleanup of its own runs) must still reach it (``child_preexec``)."""
    bench = (
        "import subprocess, sys, time\n"
        "from loadtest.bench import lib as bl\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " preexec_fn=bl.child_preexec(), start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    env, cwd = bl.child_env()
    assert not child_outlives_a_killed_parent(bench, env, cwd), "the bench's child outlived it"


def test_a_child_started_from_a_pool_thread_outlives_that_thread() -> None:
    """Linux's death signal follows the thread that forked: a child a bench starts from a pool thread
    (``asyncio.to_thread(start_proxy, …)``) must not get it when that thread ends."""
    import subprocess
    import sys
    import threading

    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        child = [sys.executable, "-c", "import time; time.sleep(60)"]
        started.append(subprocess.Popen(child, preexec_fn=bl.child_preexec(), start_new_session=True))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    (child,) = started
    try:
        time.sleep(1.0)  # a death signal is sent as the thread exits: it would have come by now
        assert child.poll() is None, "the child died with the thread that started it"
    finally:
        child.kill()
        child.wait()


def test_a_child_runs_the_copy_of_watchcache_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """consistent_get_ab starts a proxy of each of two trees in one bench: ``src`` over WATCHCACHE_BENCH_SRC."""
    monkeypatch.setattr(bl, "SRC", "/env/tree")
    env, cwd = bl.child_env()
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == ["/env/tree", str(bl.ROOT)] and cwd == "/"
    env, cwd = bl.child_env("/other/tree")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == ["/other/tree", str(bl.ROOT)] and cwd == "/"
    env, cwd = bl.child_env("")  # this work tree
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(bl.ROOT) and cwd is None


def test_consistent_get_ab_names_each_tree_with_its_commit_and_marks_uncommitted_changes(tmp_path: Path) -> None:
    import subprocess

    from loadtest.bench.consistent_get_ab import tree

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    assert tree(str(tmp_path)) == f"{tmp_path} (no git)"
    git("init", "-q")
    (tmp_path / "watchcache").mkdir()
    (tmp_path / "watchcache" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    head = git("rev-parse", "--short", "HEAD").strip()
    assert tree(str(tmp_path)) == f"{tmp_path} ({head})"
    (tmp_path / "notes.txt").write_text("outside watchcache: not the proxy's code\n")
    assert tree(str(tmp_path)) == f"{tmp_path} ({head})"
    (tmp_path / "watchcache" / "a.py").write_text("x = 2\n")
    assert tree(str(tmp_path)) == f"{tmp_path} ({head} +changes)"

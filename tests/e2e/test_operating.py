"""What an operator sees: /debug/cache and /readyz?verbose of a worker group, the upstream's errors
explained, the simulated cluster named as such."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import Proc, Stack, start, start_stack, wait_logged, wait_ready
from tests.support.httpkube import get, get_ok
from tests.support.metrics import scrape, total

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
RESOURCES = ("pods", "configmaps", "namespaces", "services")


@pytest.fixture(scope="module")
def group() -> Iterator[Stack]:
    s = start_stack("--workers", "2", "--resources", ",".join(RESOURCES))
    yield s
    s.proxy.stop()
    s.sim.stop()


def test_debug_cache_describes_every_worker_whichever_answers(group: Stack) -> None:
    # Each request is a new connection: the kernel hands them to either worker. Before, a worker
    # listed only the caches it held (its own and the followers it had made).
    for _ in range(12):
        view = get_ok(group.proxy.url, "/debug/cache")
        assert view["workers"] == 2 and view["answered"] == [0, 1], view
        assert set(view["resources"]) == set(RESOURCES), view["resources"].keys()
        for name, entry in view["resources"].items():
            assert entry["owner"] in (0, 1) and entry["ready"], (name, entry)
            assert entry["replicas"][str(entry["owner"])]["role"] == "owner"
            direct = get_ok(group.sim.url, f"/api/v1/{name}")["items"]
            assert entry["objects"] == len(direct), (name, entry["objects"], len(direct))
            assert entry["last_upstream_error"] is None


def test_readyz_verbose_describes_every_worker_whichever_answers(group: Stack) -> None:
    for _ in range(12):
        answer = get(group.proxy.url, "/readyz", verbose="")
        assert answer.status == 200
        lines = answer.body.decode().splitlines()
        for name in RESOURCES:
            assert any(line.startswith(f"[+]cache-synced:{name} (worker ") for line in lines), lines
        assert any(line.startswith("[+]upstream ok: http://127.0.0.1:") for line in lines), lines
        assert lines[-1] == "readyz check passed"


def test_a_worker_that_owns_nothing_is_ready_too() -> None:
    """Two workers, one resource: one worker owns nothing. It answered /readyz with 500 forever, so
    half the probes failed (seen failing on main)."""
    s = start_stack("--workers", "2", "--resources", "configmaps")
    try:
        for _ in range(12):
            answer = get(s.proxy.url, "/readyz", verbose="")
            assert answer.status == 200, answer.body.decode()
            assert get(s.proxy.url, "/readyz").status == 200
    finally:
        s.proxy.stop()
        s.sim.stop()


@pytest.fixture(scope="module")
def guarded_sim() -> Iterator[Proc]:
    sim = start("sim", "--objects", "10", "--namespaces", "2", "--policy-file", POLICY, "--no-anonymous-auth")
    yield sim
    sim.stop()


def test_missing_rbac_is_explained_with_the_verb_and_resource(guarded_sim: Proc, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("dave-token")  # authenticated, no rights
    proxy = start("serve", "--upstream", guarded_sim.url, "--token-file", str(token), "--workers", "1",
                  "--resources", "pods", "--authentication", "none")  # fmt: skip
    try:
        hint = 'RBAC: grant dave the verbs get, list and watch on "pods" in API group ""'
        ready = get(proxy.url, "/readyz", verbose="")
        for _ in range(100):
            if hint in ready.body.decode():
                break
            ready = get(proxy.url, "/readyz", verbose="")
        assert ready.status == 500
        text = ready.body.decode()
        assert "[-]cache-synced:pods failed: not synced; last upstream error" in text and hint in text, text
        assert "403 Forbidden: pods is forbidden" in text
        error = get_ok(proxy.url, "/debug/cache")["resources"]["pods"]["last_upstream_error"]
        assert error["reason"] == "forbidden" and error["verb"] == "list" and hint in error["hint"]
        logged = wait_logged(proxy, lambda line: "ERROR" in line and "upstream list of pods failed (forbidden)" in line)
        assert hint in logged
        assert total(scrape(proxy.url)[1], "watchcache_upstream_errors_total", resource="pods", reason="forbidden") > 0
    finally:
        proxy.stop()


def test_https_to_a_plain_http_upstream_says_it_does_not_speak_tls(guarded_sim: Proc) -> None:
    proxy = start("serve", "--upstream", guarded_sim.url.replace("http://", "https://"), "--workers", "1",
                  "--insecure-skip-tls-verify", "--resources", "pods", "--authentication", "none")  # fmt: skip
    try:
        for _ in range(100):
            text = get(proxy.url, "/readyz", verbose="").body.decode()
            if "does not speak TLS" in text:
                break
        assert "[-]upstream-discovery failed" in text and "WRONG_VERSION_NUMBER" in text, text
        assert "the upstream does not speak TLS at https://127.0.0.1:" in text
        wait_logged(proxy, lambda line: "ERROR" in line and "(not-tls)" in line)
    finally:
        proxy.stop()


def test_the_simulated_cluster_says_so() -> None:
    proc = start("serve", "--simulated", "--sim-objects", "5")
    try:
        wait_ready(proc)
        assert "SIMULATED cluster" in get(proc.url, "/readyz", verbose="").body.decode()
        wait_logged(proc, lambda line: "WARNING" in line and "SIMULATED cluster" in line)
    finally:
        proc.stop()

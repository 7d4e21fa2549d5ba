"""One upstream watch per resource per encoding read (upstream/encodings.py), counted at the upstream.

A real proxy process in front of the recorded kube-apiserver, with a short ``--encoding-idle-timeout``:
a resource read only in protobuf costs one upstream watch (its JSON feed suspended), one read in
both costs two, one read only in JSON one again (its protobuf cache dropped); /readyz stays 200
throughout and /debug/cache says which caches hold what.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Proc, start, wait_ready
from harness.waiting import wait_until
from tests.protobuf.recorded import PB, RecordedUpstream
from tests.protobuf.test_recorded import request
from tests.support.metrics import scrape, total

IDLE = 1.0  # --encoding-idle-timeout
PODS = "/api/v1/pods"


@pytest.fixture(scope="module")
def proxy(upstream: RecordedUpstream) -> Iterator[Proc]:
    proc = start(
        "serve", "--upstream", upstream.url, "--authentication", "none", "--workers", "1",
        "--resources", "pods,configmaps", "--encoding-idle-timeout", str(IDLE),
    )  # fmt: skip
    wait_ready(proc)
    yield proc
    proc.stop()


def watches(upstream: RecordedUpstream) -> tuple[int, int]:
    """The proxy's open upstream watches of pods: (JSON, protobuf)."""
    return upstream.open_watches(PODS, "json"), upstream.open_watches(PODS, "protobuf")


def read_while(proc: Proc, accept: str, condition: Any, timeout: float = 20.0) -> tuple[int, str, bytes]:
    """Read pods in ``accept`` every 0.2 s (a client that keeps reading) until ``condition()``; the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = request(proc, PODS + "?resourceVersion=0", accept)
        if condition():
            return answer
        assert time.monotonic() < deadline, f"not reached; last answer {answer[:2]}"
        time.sleep(0.2)


def debug_pods(proc: Proc) -> dict[str, Any]:
    status, _, body = request(proc, "/debug/cache", "application/json")
    assert status == 200
    pods: dict[str, Any] = json.loads(body)["resources"]["pods"]
    return pods


def test_a_resource_read_in_one_encoding_costs_one_upstream_watch(proxy: Proc, upstream: RecordedUpstream) -> None:
    wait_until(lambda: watches(upstream) == (1, 0))  # only the JSON feed: nobody reads protobuf

    # Only protobuf clients: their protobuf cache starts, and the JSON feed is suspended after IDLE.
    status, content_type, _ = read_while(proxy, PB, lambda: watches(upstream) == (0, 1))
    assert (status, content_type) == (200, PB)
    pods = debug_pods(proxy)
    assert pods["state"] == "suspended" and pods["objects"] == 0 and pods["ready"] is True
    assert pods["protobuf"]["objects"] == 3 and pods["protobuf"]["ready"] is True
    assert pods["protobuf"]["object_bytes"] > 0
    assert request(proxy, "/readyz", "text/plain")[0] == 200  # served: a suspended feed is not a failure
    assert any("JSON feed of pods: suspended" in line for line in proxy.log)
    _, samples = scrape(proxy.url)
    answers = "watchcache_full_protobuf_requests_total"
    assert total(samples, "watchcache_cache_suspended", resource="pods") == 1
    assert total(samples, "watchcache_cache_ready", resource="pods") == 1
    assert not [s for s in samples["apiserver_watch_cache_resource_version"] if s.labels["resource"] == "pods"]
    assert total(samples, answers, answer="protobuf-cache") > 0  # and before it synced, protobuf alone:
    assert total(samples, answers, answer="passed-through") == total(samples, "watchcache_passthrough_requests_total",
                                                                        reason="protobuf")  # fmt: skip

    # A JSON read resumes the JSON feed and is answered from the resynced cache (waiting for it: no 429).
    status, content_type, body = request(proxy, PODS + "?resourceVersion=0", "application/json")
    assert (status, content_type) == (200, "application/json")
    assert len(json.loads(body)["items"]) == 3
    assert debug_pods(proxy)["state"] == "ready"

    # Both encodings read: two upstream watches, for as long as both are read.
    def both() -> bool:
        request(proxy, PODS + "?resourceVersion=0", "application/json")
        return watches(upstream) == (1, 1)

    read_while(proxy, PB, both)
    for _ in range(int(3 * IDLE / 0.2)):
        assert request(proxy, PODS + "?resourceVersion=0", PB)[1] == PB
        assert request(proxy, PODS + "?resourceVersion=0", "application/json")[0] == 200
        assert watches(upstream) == (1, 1)
        time.sleep(0.2)

    # Only JSON clients again: the protobuf cache is dropped after IDLE.
    read_while(proxy, "application/json", lambda: watches(upstream) == (1, 0))
    assert "protobuf" not in debug_pods(proxy)
    # configmaps, never read in protobuf, kept their one JSON watch throughout.
    assert upstream.open_watches("/api/v1/configmaps", "json") == 1
    assert upstream.open_watches("/api/v1/configmaps", "protobuf") == 0


def test_the_protobuf_cache_going_resumes_the_json_feed(proxy: Proc, upstream: RecordedUpstream) -> None:
    """Nobody reads at all: the resource returns to its JSON feed, never to no cache."""
    read_while(proxy, PB, lambda: watches(upstream) == (0, 1))
    wait_until(lambda: watches(upstream) == (1, 0), timeout=10 * IDLE + 10)
    wait_until(lambda: debug_pods(proxy)["state"] == "ready")
    assert request(proxy, "/readyz", "text/plain")[0] == 200
    assert any("JSON feed of pods: resumed (its protobuf cache is gone)" in line for line in proxy.log)


@pytest.fixture(scope="module")
def group(record: dict[str, Any]) -> Iterator[tuple[Proc, RecordedUpstream]]:
    upstream = RecordedUpstream(record)  # its own: the watches counted are this group's only
    proc = start(
        "serve", "--upstream", upstream.url, "--authentication", "none", "--workers", "2",
        "--resources", "pods", "--encoding-idle-timeout", str(IDLE),
    )  # fmt: skip
    try:
        wait_ready(proc)
        yield proc, upstream
    finally:
        proc.stop()
        upstream.stop()


def test_in_a_worker_group_a_json_read_on_any_worker_resumes_the_owners_json_feed(
    group: tuple[Proc, RecordedUpstream],
) -> None:
    """The owner's JSON feed is suspended while both workers' clients read protobuf (the other worker follows
    the owner's protobuf cache); a JSON read on either worker (a follower of the owner's JSON cache on the
    other) resumes it, and is answered from the cache."""
    proc, upstream = group
    read_while(proc, PB, lambda: watches(upstream) == (0, 1))
    assert any("JSON feed of pods: suspended" in line for line in proc.log)
    for _ in range(12):  # new connections: the kernel spreads them over both workers
        status, content_type, body = request(proc, PODS + "?resourceVersion=0", "application/json")
        assert (status, content_type) == (200, "application/json"), body[:200]
        assert len(json.loads(body)["items"]) == 3
    wait_until(lambda: watches(upstream)[0] == 1)
    assert request(proc, "/readyz", "text/plain")[0] == 200

"""/metrics of a running multi-worker `watchcache serve`: the named series exist with their labels,
parse, and move when events flow, watchers connect, lists are served and a worker restarts."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
import time

from harness.processes import start_stack
from harness.waiting import wait_until
from tests.support.httpkube import WatchStream, get_ok, path_with
from tests.support.metrics import scrape, total

NAMED = [
    "apiserver_watch_cache_events_received_total",
    "apiserver_watch_cache_events_dispatched_total",
    "apiserver_watch_cache_resource_version",
    "apiserver_watch_cache_initializations_total",
    "apiserver_terminated_watchers_total",
    "apiserver_cache_list_total",
    "apiserver_cache_list_fetched_objects_total",
    "apiserver_cache_list_returned_objects_total",
    "apiserver_watch_cache_read_wait_seconds_bucket",
    "apiserver_watch_cache_consistent_read_total",
    "watchcache_consistent_read_target_seconds_bucket",
    "watchcache_consistent_read_total_seconds_bucket",
    "watchcache_consistency_scope_lists_total",
    "watchcache_waiting_requests",
    "apiserver_current_inflight_requests",
    "watchcache_passthrough_streams",
    "apiserver_request_total",
    "apiserver_request_duration_seconds_bucket",
    "apiserver_longrunning_requests",
    "apiserver_watch_events_total",
    "apiserver_watch_events_sizes_bucket",
    "watchcache_cached_objects",
    "watchcache_cached_bytes",
    "watchcache_history_events",
    "watchcache_history_seconds",
    "watchcache_history_oldest_resource_version",
    "watchcache_reflector_relists_total",
    "watchcache_reflector_watch_restarts_total",
    "watchcache_reflector_gone_total",
    "watchcache_reflector_last_event_age_seconds",
    "watchcache_follower_synced",
    "watchcache_slow_watchers_total",
    "watchcache_delivery_failures_total",
    "watchcache_split_groups_total",
    "watchcache_passthrough_requests_total",
    "watchcache_passthrough_sharded_requests_total",
    "watchcache_full_protobuf_requests_total",
    "watchcache_cache_suspended",
    "watchcache_worker_restarts_total",
    "watchcache_event_delivery_seconds_bucket",
    "watchcache_watch_writes_total",
    "watchcache_watch_frames_written_total",
    "watchcache_watch_frames_per_write_bucket",
    "watchcache_build_info",
]


def test_metrics_exist_parse_carry_labels_and_move():
    stack = start_stack("--workers", "2", sim_args=("--objects", "60", "--namespaces", "2", "--churn", "50"))
    try:
        url = stack.proxy.url
        # Make every series exist: lists, gets, a consistent read, a pass-through, a follower, a watch.
        for _ in range(6):
            get_ok(url, "/api/v1/pods", limit=5)
            get_ok(url, "/api/v1/configmaps")
            get_ok(url, "/api/v1/namespaces/ns-0/pods", resourceVersion="0")
        get_ok(url, "/version")
        with WatchStream(url, path_with("/api/v1/pods", watch=1, resourceVersion="0")) as watch:
            watch.until(lambda e: e["type"] == "MODIFIED", timeout=10)
            text, first = scrape(url)
            missing = [n for n in NAMED if n not in first]
            assert not missing, missing
            workers = {s.labels.get("worker") for samples in first.values() for s in samples}
            assert workers == {"0", "1"}, workers
            # No prometheus-client _created families (they were 12 extra gauges); one build info per worker.
            assert not [name for name in first if name.endswith("_created")]
            assert "_created" not in text
            info = first["watchcache_build_info"]
            assert sorted(s.labels["worker"] for s in info) == ["0", "1"] and {s.value for s in info} == {1.0}
            assert {s.labels["version"] for s in info} == {importlib.metadata.version("watchcache")}
            assert total(first, "apiserver_longrunning_requests", resource="pods", verb="WATCH") >= 1
            received = total(first, "apiserver_watch_cache_events_received_total", resource="pods")
            lists = total(first, "apiserver_cache_list_total", resource="pods")
            for sample in first["apiserver_request_total"]:
                assert {"verb", "group", "resource", "code", "worker"} <= set(sample.labels)
            if shutil.which("promtool"):
                check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
                assert check.returncode == 0, check.stdout + check.stderr
            get_ok(url, "/api/v1/pods", limit=5)
            _, second = scrape(url)
            assert total(second, "apiserver_cache_list_total", resource="pods") > lists
            # The churn goes on: the events counter moves, and so do the writes to our watch.
            writes = total(first, "watchcache_watch_writes_total")
            wait_until(
                lambda: total(scrape(url)[1], "apiserver_watch_cache_events_received_total", resource="pods") > received
            )
            wait_until(lambda: total(scrape(url)[1], "watchcache_watch_writes_total") > writes)
            _, third = scrape(url)
            # Every write carried at least one frame; one observation per flush pass that wrote.
            assert total(third, "watchcache_watch_frames_written_total") >= total(
                third, "watchcache_watch_writes_total"
            )
            passes = total(third, "watchcache_watch_frames_per_write_count")
            assert 0 < passes <= total(third, "watchcache_watch_writes_total")
        # A worker restart is counted.
        view = get_ok(url, "/debug/shards")
        os.kill(view["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while True:
            try:
                _, after = scrape(url)
                if total(after, "watchcache_worker_restarts_total", worker=str(view["worker"])) >= 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "worker restart not counted"
            time.sleep(0.2)
    finally:
        stack.proxy.stop()
        stack.sim.stop()

"""A read at an rv ahead of a quiet cache, against kube-apiserver v1.36: proven by a probe, not 504.

LimitRanges nobody writes; a ConfigMap written elsewhere moves the cluster's rv to ``R`` (read
directly). Through the proxy, a LIST at ``R`` — ``resourceVersionMatch=NotOlderThan`` and
``Exact`` — is ahead of the LimitRanges cache: the proxy's probe watch (``upstream/probes.py``)
proves the cache current and the LIST is answered from it, at ``R`` for Exact, as kube answers
it (kube asks etcd for progress). The probe's consistent read makes kube's cache of the quiet
resource move and send bookmarks at all: before it, every probe ended without a bookmark and each
read got 504 "Too large resource version" after ``--fresh-wait`` (3 s).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from harness.kube.kit import Api, KubeEnv, Serving, drop_namespace, needs_kube, start_proxy

pytestmark = needs_kube

NS = "restarts-reads-ahead"
LIMITRANGES = "/api/v1/limitranges"


def test_lists_at_an_rv_ahead_of_a_quiet_cache_are_proven_and_served(tmp_path: Path) -> None:
    kube = KubeEnv.from_environ()
    direct = Api(kube.url, kube.token, kube.ca)
    drop_namespace(direct, NS, ("configmaps",))
    direct.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    serving = Serving.make(tmp_path)
    proc = start_proxy(kube, serving, "--workers", "1", resources="limitranges")
    through = Api(proc.url, kube.token, str(serving.ca.crt))
    try:
        for i, match in enumerate(("NotOlderThan", "Exact", "Exact", "NotOlderThan")):
            direct.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": f"cm-{i}"}})
            r = int(direct.get(f"/api/v1/namespaces/{NS}/configmaps")["metadata"]["resourceVersion"])
            started = time.monotonic()
            status, _, body = through.raw("GET", f"{LIMITRANGES}?resourceVersion={r}&resourceVersionMatch={match}")
            took = time.monotonic() - started
            assert status == 200, (match, r, status, body[:300], f"{took:.2f}s")
            answer: dict[str, Any] = json.loads(body)
            listed = int(answer["metadata"]["resourceVersion"])
            assert listed == r if match == "Exact" else listed >= r, (match, r, listed)
            assert took < 2.9, (match, f"{took:.2f}s")  # proven, not the last moments of --fresh-wait
        metrics = through.raw("GET", "/metrics", accept="text/plain")[2].decode()
        proved = [
            line
            for line in metrics.splitlines()
            if line.startswith("watchcache_consistency_probes_total") and 'resource="limitranges"' in line
        ]
        assert any('outcome="proved"' in line for line in proved), proved
        passed = [line for line in metrics.splitlines() if line.startswith("watchcache_passthrough_requests_total")]
        assert all(line.endswith(" 0.0") for line in passed if "limitranges" in line), passed
    finally:
        through.close()
        proc.stop()
        drop_namespace(direct, NS, ("configmaps",))
        direct.close()


def test_events_ahead_of_the_cache_are_the_apiservers_answers_and_a_watch_from_there_waits(tmp_path: Path) -> None:
    """kube-apiserver serves events from etcd (no watch cache by default): their watches send no
    bookmark, so no probe proves the proxy's events cache, and kube answers a read at any rv at once.
    From the proxy's first read on (events start out unprovable: upstream/probes.py), a GET or LIST
    ahead of the cache goes to kube at once (its 200), and a watch from an rv ahead waits for the
    events after it, as kube's does (no 504). Before session 46, the reads ahead got 504 after
    --fresh-wait until three probes (3 s each) had ended without a bookmark."""
    kube = KubeEnv.from_environ()
    direct = Api(kube.url, kube.token, kube.ca)
    drop_namespace(direct, NS, ("configmaps", "events"))
    direct.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    serving = Serving.make(tmp_path)
    # --fresh-wait 1: a watch from an rv ahead is past it before its event comes (below).
    proc = start_proxy(kube, serving, "--workers", "1", "--fresh-wait", "1", resources="events")
    through = Api(proc.url, kube.token, str(serving.ca.crt), timeout=15)
    events = f"/api/v1/namespaces/{NS}/events"
    try:

        def ahead(i: int) -> int:
            cm = direct.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": f"ev-{i}"}})
            return int(cm["metadata"]["resourceVersion"])

        for i, match in enumerate(("NotOlderThan", "Exact", "NotOlderThan"), start=1):
            r = ahead(i)
            query = f"{events}?resourceVersion={r}&resourceVersionMatch={match}"
            started = time.monotonic()
            status, _, body = through.raw("GET", query)
            took = time.monotonic() - started
            want_status, _, want_body = direct.raw("GET", query)
            assert (status, want_status) == (200, 200), (match, body[:300])
            assert json.loads(body)["items"] == json.loads(want_body)["items"]
            assert took < 1.0, f"{took:.2f}s"
        metrics = through.raw("GET", "/metrics", accept="text/plain")[2].decode()
        unreached = [line for line in metrics.splitlines() if 'reason="unreached-rv"' in line]
        assert any(line.startswith("watchcache_passthrough_requests_total") and not line.endswith(" 0.0")
                   for line in unreached), unreached  # fmt: skip
        # A watch from an rv ahead: nothing until an event after it, which comes (no ERROR 504).
        r = ahead(9)
        reader = Api(proc.url, kube.token, str(serving.ca.crt), timeout=20)
        got: list[Any] = []

        def watch() -> None:
            status, _, body = reader.raw("GET", f"{events}?watch=1&resourceVersion={r}&timeoutSeconds=3")
            got.extend((status, json.loads(line)["type"]) for line in body.splitlines() if line)

        t = threading.Thread(target=watch)
        t.start()
        time.sleep(1.5)  # past --fresh-wait (1 s): the proxy used to end it with a 504 ERROR here
        about = {"kind": "ConfigMap", "name": "ev-9", "namespace": NS}
        event = {"metadata": {"name": "ev-ahead"}, "involvedObject": about, "reason": "Ahead", "type": "Normal"}
        direct.create(events, event)
        t.join(15)
        reader.close()
        assert got == [(200, "ADDED")], got
    finally:
        through.close()
        proc.stop()
        drop_namespace(direct, NS, ("configmaps", "events"))
        direct.close()


def _probes(api: Api, resource: str, outcome: str) -> float:
    metrics = api.raw("GET", "/metrics", accept="text/plain")[2].decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("watchcache_consistency_probes_total{")
        and f'outcome="{outcome}"' in line
        and f'resource="{resource}"' in line
    )

"""ChurnUser: the writer. Creates, updates and deletes configmaps at a fixed rate, stamped.

Every create and update carries ``latency.WRITTEN_AT`` (``time.time()`` just before sending); every
DELETE's send time goes to the process's ``DeleteClock``: the watchers time their events from
these. Writes go through the target (the proxy passes them through, as it does a kubectl
apply) or, with ``--writes-via upstream``, straight to ``--upstream-host``.

Each user keeps between ``MIN_LIVE`` and ``MAX_LIVE`` of its objects per namespace, so the mix
settles at about 35% creates, 20% deletes and 45% updates, and deletes what is left when it stops.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import orjson
from locust import FastHttpUser, task

from loadtest.locust.context import RunContext, user_context
from loadtest.locust.latency import WRITER_LABEL, WRITTEN_AT, stamp
from loadtest.locust.reads import collection_path

MIN_LIVE = 5
MAX_LIVE = 20
PAYLOAD = "x" * 512  # a small configmap: the events stay cheap to fan out and to parse
CLEANUP_BUDGET = 10.0  # seconds on_stop may spend deleting what is left


class ChurnUser(FastHttpUser):
    fixed_count = 1  # one writer; its rate is --churn-rate

    def on_start(self) -> None:
        self.ctx: RunContext = user_context(self.environment)
        self.writer = f"{self.ctx.run_id}-{self.ctx.deal('ChurnUser')}"
        self.seq = itertools.count()
        self.live: dict[str, list[str]] = {ns: [] for ns in self.ctx.settings.churn_namespaces}
        self.base = self.ctx.settings.write_base
        self.next_at = time.monotonic()

    def wait_time(self) -> float:
        """Constant pacing at --churn-rate; after a stall, catch up by at most one second of writes."""
        interval = 1.0 / self.ctx.settings.churn_rate
        now = time.monotonic()
        self.next_at = max(self.next_at + interval, now - 1.0)
        return max(0.0, self.next_at - now)

    def _send(self, method: str, url: str, name: str, body: dict[str, Any] | None, content_type: str) -> bool:
        headers = self.ctx.settings.headers(content_type=content_type)
        data = orjson.dumps(body) if body is not None else None
        # FastHttpSession sends bytes as they are (its stubs say str/dict only).
        request = self.client.request
        with request(method, url, name=name, data=data, headers=headers, catch_response=True) as resp:  # type: ignore[arg-type]
            if resp.status_code in (200, 201, 202):
                resp.success()
                return True
            text = (resp.content or b"")[:200].decode("utf-8", "replace")
            resp.failure(f"HTTP {resp.status_code}: {text}" if resp.status_code else str(getattr(resp, "error", "")))
            return False

    def create(self, namespace: str) -> None:
        name = f"lt-{self.writer}-{next(self.seq)}"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {WRITER_LABEL: self.writer},
                "annotations": {WRITTEN_AT: stamp()},
            },
            "data": {"seq": "0", "payload": PAYLOAD},
        }
        url = self.base + collection_path("configmaps", namespace)
        if self._send("POST", url, "configmaps", body, "application/json"):
            self.live[namespace].append(name)

    def update(self, namespace: str, name: str) -> None:
        patch = {"metadata": {"annotations": {WRITTEN_AT: stamp()}}, "data": {"seq": str(next(self.seq))}}
        url = f"{self.base}{collection_path('configmaps', namespace)}/{name}"
        self._send("PATCH", url, "configmaps/[name]", patch, "application/merge-patch+json")

    def delete(self, namespace: str, name: str) -> None:
        url = f"{self.base}{collection_path('configmaps', namespace)}/{name}"
        self.live[namespace].remove(name)
        self.ctx.deletes.sent(namespace, name, time.time())
        self._send("DELETE", url, "configmaps/[name]", None, "application/json")

    @task
    def write(self) -> None:
        namespace = random.choice(self.ctx.settings.churn_namespaces)
        live = self.live[namespace]
        r = random.random()
        if len(live) < MIN_LIVE or (len(live) < MAX_LIVE and r < 0.35):
            self.create(namespace)
        elif len(live) >= MAX_LIVE or r < 0.55:
            self.delete(namespace, random.choice(live))
        else:
            self.update(namespace, random.choice(live))

    def on_stop(self) -> None:
        if not hasattr(self, "ctx"):  # on_start stopped it: the test did not start
            return
        deadline = time.monotonic() + CLEANUP_BUDGET
        for namespace, names in self.live.items():
            for name in list(names):
                if time.monotonic() > deadline:
                    return
                self.delete(namespace, name)

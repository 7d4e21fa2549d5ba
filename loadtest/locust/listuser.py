"""ListUser: what kubectl and dashboards do: paged and full LISTs, selectors, GETs of single objects.

Consistent reads (no resourceVersion, as kubectl sends) are served by watchcache from its cache
once it proves the cache fresh (one upstream LIST limit=1, shared by concurrent requests), else
passed through; ``rv=0`` reads are served from the cache as it is. Both appear, named apart.
"""

from __future__ import annotations

import random
from typing import Any

from locust import FastHttpUser, between, task

from loadtest.locust.context import RunContext, user_context
from loadtest.locust.reads import collection_path, list_all, read

# The simulated cluster's pod labels (watchcache/sim/fixtures.py); on a real cluster these
# selectors may match nothing, which is still a valid (cheap) request.
APPS = ("frontend", "checkout", "catalog", "payments", "search", "auth", "ledger", "mailer", "gateway", "metrics")
TIERS = ("web", "backend", "cache", "worker")
KNOWN_NAMES = 500  # (namespace, name) pairs kept for GETs, refreshed from every pod list


class ListUser(FastHttpUser):
    weight = 3
    wait_time = between(0.5, 1.5)

    def on_start(self) -> None:
        self.ctx: RunContext = user_context(self.environment)
        self.headers = self.ctx.settings.headers()
        self.pods: list[tuple[str, str]] = []
        self.nodes: list[str] = []

    # -- helpers
    def _namespace(self) -> str:
        return random.choice(self.ctx.settings.namespaces)

    def _learn(self, items: list[dict[str, Any]]) -> None:
        found = []
        for item in items:
            meta = item.get("metadata", {})
            found.append((meta.get("namespace", ""), meta.get("name", "")))
            node = item.get("spec", {}).get("nodeName")
            if node and node not in self.nodes and len(self.nodes) < 100:
                self.nodes.append(node)
        if found:
            self.pods = random.sample(found, min(KNOWN_NAMES, len(found)))

    # -- tasks
    @task(3)
    def paged_list(self) -> None:
        """kubectl get --chunk-size: a consistent first page, then continue tokens."""
        if random.random() < 0.5:
            path, limit, label = collection_path("pods", None), 250, "pods -A limit=250"
        else:
            path, limit, label = collection_path("pods", self._namespace()), 50, "pods -n [ns] limit=50"
        page = list_all(self.client, path, {"limit": str(limit)}, label, self.headers)
        if page is not None:
            self._learn(page.items)

    @task(2)
    def full_list(self) -> None:
        choice = random.random()
        if choice < 0.4:
            page = list_all(
                self.client,
                collection_path("pods", self._namespace()),
                {"resourceVersion": "0"},
                "pods -n [ns] rv=0",
                self.headers,
            )
            if page is not None:
                self._learn(page.items)
        elif choice < 0.8:
            list_all(self.client, collection_path("configmaps", None), {}, "configmaps -A", self.headers)
        else:
            list_all(self.client, collection_path("nodes", None), {"resourceVersion": "0"}, "nodes rv=0", self.headers)

    @task(1)
    def big_list(self) -> None:
        """Every pod of the cluster from the cache, unpaged (the informer-restart case)."""
        page = list_all(
            self.client, collection_path("pods", None), {"resourceVersion": "0"}, "pods -A rv=0", self.headers
        )
        if page is not None:
            self._learn(page.items)

    @task(3)
    def selector_list(self) -> None:
        choice = random.random()
        if choice < 0.4:
            params = {"labelSelector": f"app={random.choice(APPS)}"}
            list_all(self.client, collection_path("pods", None), params, "pods -A labelSelector=app", self.headers)
        elif choice < 0.7 and self.nodes:
            params = {"fieldSelector": f"spec.nodeName={random.choice(self.nodes)}", "resourceVersion": "0"}
            list_all(
                self.client,
                collection_path("pods", None),
                params,
                "pods -A fieldSelector=spec.nodeName rv=0",
                self.headers,
            )
        else:
            tiers = ",".join(random.sample(TIERS, 2))
            params = {"labelSelector": f"tier in ({tiers}),app!=metrics", "fieldSelector": "status.phase=Running"}
            list_all(
                self.client,
                collection_path("pods", self._namespace()),
                params,
                "pods -n [ns] labelSelector+fieldSelector",
                self.headers,
            )

    @task(6)
    def get(self) -> None:
        if not self.pods:
            self.paged_list()
            return
        namespace, name = random.choice(self.pods)
        path = f"{collection_path('pods', namespace)}/{name}"
        if random.random() < 0.5:
            read(self.client, "GET", path, {}, "pods/[name]", self.headers, allow_not_found=True)
        else:
            read(
                self.client,
                "GET",
                path,
                {"resourceVersion": "0"},
                "pods/[name] rv=0",
                self.headers,
                allow_not_found=True,
            )

"""A stand-in for kubelets: fake Nodes that stay Ready, and what a kubelet does to their pods.

The kit has no kubelet (its README): a Node must be created with a Ready condition and
allocatable resources, and its Lease in ``kube-node-lease`` renewed, or the node-lifecycle
controller marks it unreachable (and taints it) within a minute. A pod bound to it never runs:
this stand-in reports it Running and Ready (what the Deployment controller waits for), and
finishes a graceful deletion at once (``gracePeriodSeconds=0``, as a kubelet does once the
containers have stopped). It talks to the apiserver directly: it is not under test, and it
reacts the same way whichever server the controllers use.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import queue
import socket
import threading
from typing import Any

from harness.kube.kit import Api, ApiError, with_query

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def now(micro: bool = False) -> str:
    t = datetime.datetime.now(datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else t.strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    """Nodes ``prefix-0..n-1``, their leases renewed every ``renew`` seconds, their pods run at once."""

    def __init__(self, api: Api, prefix: str, nodes: int = 3, *, renew: float = 5.0) -> None:
        self.api = api
        self.nodes = [f"{prefix}-{i}" for i in range(nodes)]
        self.renew = renew
        self.stop = threading.Event()
        self.work: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.started_pods: set[str] = set()
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        # The pod watch's connection, shut on exit: its thread waits in a read for the next event.
        self._watching: http.client.HTTPConnection | None = None

    # ---------------------------------------------------------------- nodes

    def node(self, name: str) -> dict[str, Any]:
        ready = {
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet",
            "lastHeartbeatTime": now(), "lastTransitionTime": now(),
        }  # fmt: skip
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "watchcache-reference": "1"}},
            "status": {"conditions": [ready], "allocatable": resources, "capacity": resources},
        }

    def create_nodes(self) -> None:
        for name in self.nodes:
            self.api.delete(f"/api/v1/nodes/{name}")
            self.api.create("/api/v1/nodes", self.node(name))
            lease = {
                "metadata": {"name": name},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now(micro=True)},
            }
            self.api.delete(f"{LEASES}/{name}")
            self.api.create(LEASES, lease)

    def delete_nodes(self) -> None:
        for name in self.nodes:
            self.api.delete(f"/api/v1/nodes/{name}")
            self.api.delete(f"{LEASES}/{name}")

    def _renew_leases(self) -> None:
        while not self.stop.wait(self.renew):
            for name in self.nodes:
                try:
                    self.api.merge_patch(f"{LEASES}/{name}", {"spec": {"renewTime": now(micro=True)}})
                except (ApiError, OSError) as e:
                    self.errors.append(f"lease {name}: {e}")

    # ---------------------------------------------------------------- pods

    def _watch_pods(self) -> None:
        """LIST then WATCH every pod (the apiserver's own answers), handing ours to the workers."""
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    doc = self.api.get("/api/v1/pods")
                    for pod in doc["items"]:
                        self._offer(pod)
                    rv = doc["metadata"]["resourceVersion"]
                rv = self._stream(rv)
            except (ApiError, OSError, ValueError, http.client.HTTPException) as e:
                if not self.stop.is_set():
                    self.errors.append(f"pod watch: {e}")
                rv = ""
                self.stop.wait(0.5)

    def _stream(self, rv: str) -> str:
        path = with_query("/api/v1/pods", watch=1, resourceVersion=rv, allowWatchBookmarks=True, timeoutSeconds=10)
        conn = self.api.connect(30)  # the server ends the watch after 10 s; stop is checked between events
        self._watching = conn
        try:
            conn.request("GET", path, headers=self.api.headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ApiError(resp.status, resp.read())
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    return rv
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    return "" if obj.get("code") == 410 else rv
                rv = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._offer(obj)
            return rv
        finally:
            conn.close()

    def _offer(self, pod: dict[str, Any]) -> None:
        if pod.get("spec", {}).get("nodeName") in self.nodes:
            self.work.put(pod)

    def _worker(self) -> None:
        while True:
            pod = self.work.get()
            if pod is None:
                return
            meta = pod["metadata"]
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            try:
                if meta.get("deletionTimestamp"):
                    # the containers "stopped": finish the graceful deletion, as a kubelet does
                    self.api.delete(path, gracePeriodSeconds=0, preconditions={"uid": meta["uid"]})
                elif meta["uid"] not in self.started_pods and pod.get("status", {}).get("phase") != "Running":
                    self.api.merge_patch(f"{path}/status", {"status": self.running(pod)})
                    self.started_pods.add(meta["uid"])
            except ApiError as e:
                if e.status not in (404, 409):  # gone, or a newer version of it is on its way
                    self.errors.append(f"pod {meta['namespace']}/{meta['name']}: {e}")
            except OSError as e:
                self.errors.append(f"pod {meta['namespace']}/{meta['name']}: {e}")

    @staticmethod
    def running(pod: dict[str, Any]) -> dict[str, Any]:
        t = now()
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": t}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ]
        containers = [
            {
                "name": c["name"], "image": c["image"], "imageID": "", "ready": True, "started": True,
                "restartCount": 0, "state": {"running": {"startedAt": t}},
            }
            for c in pod["spec"]["containers"]
        ]  # fmt: skip
        return {"phase": "Running", "conditions": conditions, "containerStatuses": containers, "startTime": t}

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> FakeKubelet:
        self.create_nodes()
        targets = [self._renew_leases, self._watch_pods, self._worker, self._worker]
        self._threads = [threading.Thread(target=t, daemon=True, name=f"kubelet-{t.__name__}") for t in targets]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        conn = self._watching
        if conn is not None and conn.sock is not None:
            # Not SSLSocket.shutdown, which drops the TLS object under the reading thread: the socket's.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
        for _ in range(2):
            self.work.put(None)
        for t in self._threads:
            t.join(10)
        self.delete_nodes()

"""The control-plane scenario: what kube-controller-manager and kube-scheduler must drive to completion.

Each step makes its writes to the apiserver directly (the test is a user, not a component under
test) and waits, polling the apiserver every 50 ms, for the state the controllers must reach; its
time is from the first write to that state. The same steps run with the components pointed at the
apiserver and at the proxy, in namespaces of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.kube import crds
from harness.kube.kit import Api, wait_for, with_query

CRD_GROUP = "reference.watchcache.example.com"
CRD_NAME = f"gizmos.{CRD_GROUP}"
CRD_RESOURCE = f"{CRD_GROUP}/v1/gizmos"
LABEL = "watchcache-reference"
PODS = 12  # scheduled directly
REPLICAS = 3

STEPS = (
    "namespace: ServiceAccount + root CA",
    f"scheduling: {PODS} pods bound",
    f"rollout: Deployment of {REPLICAS} complete",
    "rollout: new revision complete",
    f"scale-down {REPLICAS} to 1",
    "GC: ReplicaSet and its pods",
    "GC: custom resource's dependents",
    "namespace deletion finalized",
)


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def ensure_crd(api: Api) -> None:
    """The scenario's CRD, created if missing (after a deletion of it still under way), and served."""
    crds.ensure_crd(api, crd())


@dataclass
class Scenario:
    api: Api  # the apiserver, as the admin
    namespace: str
    timeout: float = 120.0
    times: dict[str, float] = field(default_factory=dict)
    _started: float = 0.0

    @property
    def ns(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}"

    @property
    def apps(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}"

    @property
    def gizmos(self) -> str:
        return f"/apis/{CRD_GROUP}/v1/namespaces/{self.namespace}/gizmos"

    def run(self) -> dict[str, float]:
        steps: list[Callable[[], None]] = [
            self.create_namespace, self.schedule, self.roll_out, self.new_revision, self.scale_down,
            self.collect_replica_set, self.collect_custom_resource, self.delete_namespace,
        ]  # fmt: skip
        for name, step in zip(STEPS, steps, strict=True):
            self.begin()
            step()
            self.times[name] = time.monotonic() - self._started
        return self.times

    def begin(self) -> None:
        """The step's clock starts now (steps that prepare objects first call it before the write that counts)."""
        self._started = time.monotonic()

    def until(self, condition: Callable[[], object], what: str) -> None:
        wait_for(condition, self.timeout, f"{self.namespace}: {what}")

    def names(self, path: str, **params: Any) -> list[str]:
        return [i["metadata"]["name"] for i in self.api.get(with_query(path, **params))["items"]]

    # ---------------------------------------------------------------- steps

    def create_namespace(self) -> None:
        self.api.create("/api/v1/namespaces", {"metadata": {"name": self.namespace, "labels": {LABEL: "1"}}})
        self.until(
            lambda: (
                self.api.exists(f"{self.ns}/serviceaccounts/default")
                and self.api.exists(f"{self.ns}/configmaps/kube-root-ca.crt")
            ),
            "the default ServiceAccount and the kube-root-ca.crt ConfigMap",
        )

    def schedule(self) -> None:
        for i in range(PODS):
            pod = {
                "metadata": {"name": f"sched-{i}", "labels": {"app": "sched"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/none:1"}]},
            }
            self.api.create(f"{self.ns}/pods", pod)
        self.until(
            lambda: all(p["spec"].get("nodeName") for p in self.api.get(f"{self.ns}/pods")["items"]),
            f"{PODS} pods bound",
        )

    def deployment(self) -> dict[str, Any]:
        return self.api.get(f"{self.apps}/deployments/web")

    def rolled_out(self, replicas: int) -> bool:
        d = self.deployment()
        s = d.get("status", {})
        return (
            s.get("observedGeneration", 0) >= d["metadata"]["generation"]
            and s.get("updatedReplicas") == replicas
            and s.get("replicas") == replicas
            and s.get("availableReplicas") == replicas
            and len(self.names(f"{self.ns}/pods", labelSelector="app=web")) == replicas
        )

    def roll_out(self) -> None:
        labels = {"app": "web"}
        deployment = {
            "metadata": {"name": "web", "labels": labels},
            "spec": {
                "replicas": REPLICAS,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
                },
            },
        }
        self.api.create(f"{self.apps}/deployments", deployment)
        self.until(lambda: self.rolled_out(REPLICAS), "the rollout")

    def new_revision(self) -> None:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "registry.example/web:2"}]}}}}
        self.api.merge_patch(f"{self.apps}/deployments/web", patch)

        def done() -> bool:
            sets = self.api.get(with_query(f"{self.apps}/replicasets", labelSelector="app=web"))["items"]
            return (
                self.rolled_out(REPLICAS)
                and len(sets) == 2
                and sorted(rs["spec"]["replicas"] for rs in sets) == [0, REPLICAS]
            )

        self.until(done, "the new revision's rollout")

    def scale_down(self) -> None:
        self.api.merge_patch(f"{self.apps}/deployments/web", {"spec": {"replicas": 1}})
        self.until(lambda: self.rolled_out(1), "the scale-down")

    def collect_replica_set(self) -> None:
        self.api.delete(f"{self.apps}/deployments/web", propagationPolicy="Background")
        self.until(
            lambda: (
                not self.names(f"{self.apps}/replicasets", labelSelector="app=web")
                and not self.names(f"{self.ns}/pods", labelSelector="app=web")
            ),
            "the ReplicaSets and pods of the deleted Deployment collected",
        )

    def collect_custom_resource(self) -> None:
        owner = self.api.create(self.gizmos, {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Gizmo",
                                              "metadata": {"name": "owner"}, "spec": {"size": 1}})  # fmt: skip
        ref = {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Gizmo", "name": "owner", "uid": owner["metadata"]["uid"]}
        labels = {"owned-by": "owner"}
        for i in range(5):
            meta = {"name": f"dependent-{i}", "labels": labels, "ownerReferences": [ref]}
            self.api.create(f"{self.ns}/configmaps", {"metadata": meta, "data": {"i": str(i)}})
            self.api.create(self.gizmos, {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Gizmo", "metadata": meta})
        self.begin()
        self.api.delete(f"{self.gizmos}/owner", propagationPolicy="Background")
        self.until(
            lambda: (
                not self.names(f"{self.ns}/configmaps", labelSelector="owned-by=owner")
                and not self.names(self.gizmos, labelSelector="owned-by=owner")
            ),
            "the custom resource's dependents (ConfigMaps and Gizmos) collected",
        )

    def delete_namespace(self) -> None:
        self.api.delete(self.ns)
        self.until(lambda: not self.api.exists(self.ns), "the namespace finalized and gone")

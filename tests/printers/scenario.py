"""Objects in the states kube's printers distinguish, made in a real kube-apiserver (the kit).

Used twice: once by ``capture.py`` to record kube's Tables of them (the suite tier's fixtures,
kept in ``fixtures/``), and live by the reference tier (``tests/reference/test_tables.py``),
which compares the proxy's Tables and ``kubectl get`` output with the apiserver's.

Everything lives in one namespace and a few cluster-scoped objects named with the caller's
prefix (``i23-``...), and ``cleanup`` removes them. Pod states are written with the status
subresource (there is no kubelet): pending, running, restarted "N (5m ago)", crash-looping,
init containers (waiting, failed, a restartable sidecar), completed, failed, killed by a signal,
terminating (held by a finalizer), a node-lost pod, readiness gates, scheduling gates, a
nominated node. Deployments, replica sets, stateful sets and daemon sets are driven by
kube-controller-manager (with a fake kubelet for their pods), caught mid-rollout.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from harness.kube.kit import Api, ApiError, wait_for
from harness.kube.kubelet import FakeKubelet

HOLD = "i23.example.com/hold"


def stamp(seconds_ago: float = 0) -> str:
    t = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet(FakeKubelet):
    """The kit's fake kubelet, on nodes labelled for this scenario only (others' workloads stay off)."""

    def __init__(self, api: Api, prefix: str, label: str) -> None:
        super().__init__(api, f"{prefix}-kubelet", 2)
        self.label = label

    def node(self, name: str) -> dict[str, Any]:
        node = super().node(name)
        node["metadata"]["labels"] = {"kubernetes.io/hostname": name, self.label: "1"}
        node["status"]["nodeInfo"] = {
            "kubeletVersion": "v1.36.2", "osImage": "Debian GNU/Linux 12 (bookworm)",
            "kernelVersion": "6.1.0-18-amd64", "containerRuntimeVersion": "containerd://1.7.13",
            "architecture": "amd64", "operatingSystem": "linux",
            "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": "",
        }  # fmt: skip
        node["status"]["addresses"] = [
            {"type": "InternalIP", "address": "10.1.0.7"},
            {"type": "Hostname", "address": name},
        ]
        return node


@dataclass
class Scenario:
    api: Api
    prefix: str  # e.g. "i23-tables": the namespace, and the prefix of cluster-scoped names
    kubelet: Kubelet | None = None
    crd_group: str = ""
    made: list[str] = field(default_factory=list)  # cluster-scoped paths to delete
    # A NodePort is cluster-wide: two scenarios at once (xdist workers) need two.
    node_port: int = 30080

    def __post_init__(self) -> None:
        self.crd_group = f"{self.prefix}.example.com"
        self.label = f"{self.prefix}-node"

    @property
    def ns(self) -> str:
        return self.prefix

    def path(self, resource: str, group: str = "", version: str = "v1") -> str:
        base = f"/apis/{group}/{version}" if group else "/api/v1"
        return f"{base}/namespaces/{self.ns}/{resource}"

    # ------------------------------------------------------------------ setup

    def create(self, control_plane: bool = True) -> None:
        self.cleanup()
        self.api.create("/api/v1/namespaces", {"metadata": {"name": self.ns, "labels": {"team": "tables"}}})
        wait_for(lambda: self.api.exists(f"/api/v1/namespaces/{self.ns}/serviceaccounts/default") or not control_plane,
                 30, "default service account")  # fmt: skip
        if not control_plane:
            self.api.create(self.path("serviceaccounts"), {"metadata": {"name": "default"}})
        self.nodes()
        if control_plane:
            self.kubelet = Kubelet(self.api, self.prefix, self.label).__enter__()
        self.config()
        self.services()
        self.endpoints()
        self.pods()
        self.crds()
        if control_plane:
            self.workloads()

    def cleanup(self, wait: bool = True) -> None:
        """Delete what ``create`` made. ``wait``: until the namespace is gone (its controller takes 5-10 s),
        as ``create`` needs to make it again; a teardown need not: the next ``create`` waits if it must."""
        api = self.api
        if self.kubelet is not None:
            self.kubelet.__exit__(None, None, None)
            self.kubelet = None
        if api.exists(f"/api/v1/namespaces/{self.ns}"):
            for pod in api.get(self.path("pods"))["items"]:
                if pod["metadata"].get("finalizers"):
                    api.merge_patch(
                        f"{self.path('pods')}/{pod['metadata']['name']}", {"metadata": {"finalizers": None}}
                    )
            api.delete(self.path("pods"), gracePeriodSeconds=0)
            api.delete(f"/api/v1/namespaces/{self.ns}")
            if wait:
                wait_for(lambda: not api.exists(f"/api/v1/namespaces/{self.ns}"), 120, f"namespace {self.ns} gone")
        for name in self.node_names():
            api.delete(f"/api/v1/nodes/{name}")
        for name in (f"{self.prefix}-kubelet-0", f"{self.prefix}-kubelet-1"):
            api.delete(f"/api/v1/nodes/{name}")
        for name in self.crd_names():
            api.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")

    # ------------------------------------------------------------------ nodes

    def node_names(self) -> list[str]:
        return [f"{self.prefix}-master", f"{self.prefix}-worker", f"{self.prefix}-bare"]

    def nodes(self) -> None:
        master, worker, bare = self.node_names()
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp(),
                 "lastTransitionTime": stamp()}  # fmt: skip
        taint = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
        self.api.create("/api/v1/nodes", {
            "metadata": {"name": master, "labels": {
                "node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/master": "",
                "kubernetes.io/role": "infra", "kubernetes.io/hostname": master, self.label: "static"}},
            "spec": {"taints": [taint], "podCIDR": "10.244.0.0/24"},
            "status": {
                "conditions": [ready, {"type": "MemoryPressure", "status": "False"}],
                "addresses": [{"type": "InternalIP", "address": "192.168.0.10"},
                              {"type": "ExternalIP", "address": "203.0.113.10"}],
                "nodeInfo": {"kubeletVersion": "v1.36.2", "osImage": "Ubuntu 24.04 LTS",
                             "kernelVersion": "6.8.0-31-generic", "containerRuntimeVersion": "cri-o://1.36.0",
                             "architecture": "arm64", "operatingSystem": "linux", "machineID": "",
                             "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
                "capacity": {"cpu": "4", "pods": "110"}, "allocatable": {"cpu": "4", "pods": "110"},
            },
        })  # fmt: skip
        self.api.create("/api/v1/nodes", {
            "metadata": {"name": worker, "labels": {
                "kubernetes.io/role": "worker", "node-role.kubernetes.io/gpu": "true", self.label: "static"}},
            "spec": {"unschedulable": True, "taints": [{"key": "example.com/dedicated", "value": "x",
                                                         "effect": "NoSchedule"}]},
            "status": {"conditions": [{**ready, "status": "False", "reason": "KubeletNotReady"}],
                       "nodeInfo": {"kubeletVersion": "v1.35.0", "machineID": "", "systemUUID": "", "bootID": "",
                                    "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                                    "kubeProxyVersion": "", "operatingSystem": "", "architecture": ""}},
        })  # fmt: skip
        self.api.create("/api/v1/nodes", {
            "metadata": {"name": bare, "labels": {self.label: "static"}},
            "spec": {"taints": [{"key": "example.com/bare", "effect": "NoSchedule"}]},
        })  # fmt: skip

    # ------------------------------------------------------------------ config

    def config(self) -> None:
        cms = self.path("configmaps")
        self.api.create(cms, {"metadata": {"name": "empty"}})
        self.api.create(cms, {"metadata": {"name": "mixed", "labels": {"app": "web", "tier": "front"}},
                              "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AAE="}})  # fmt: skip
        secrets = self.path("secrets")
        self.api.create(secrets, {"metadata": {"name": "opaque"}, "data": {"k": "dg==", "k2": "dg=="}})
        self.api.create(secrets, {"metadata": {"name": "tls"}, "type": "kubernetes.io/tls",
                                  "data": {"tls.crt": "", "tls.key": ""}})  # fmt: skip
        self.api.create(secrets, {"metadata": {"name": "empty"}, "type": "example.com/custom"})
        self.api.create(self.path("serviceaccounts"), {"metadata": {"name": "robot", "labels": {"team": "a"}}})
        # kube registers roles with its default table convertor (Name, Created At)
        self.api.create(self.path("roles", "rbac.authorization.k8s.io"), {"metadata": {"name": "reader"}, "rules": []})

    def services(self) -> None:
        svc = self.path("services")
        self.api.create(svc, {"metadata": {"name": "web"}, "spec": {
            "selector": {"app": "web", "tier": "front"},
            "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})  # fmt: skip
        self.api.create(svc, {"metadata": {"name": "nodeport"}, "spec": {
            "type": "NodePort", "ports": [{"port": 8080, "nodePort": self.node_port}],
            "externalIPs": ["198.51.100.7"]}})  # fmt: skip
        lb = self.api.create(svc, {"metadata": {"name": "lb"}, "spec": {
            "type": "LoadBalancer", "ports": [{"port": 443}], "selector": {"app": "lb"}}})  # fmt: skip
        self.api.merge_patch(f"{svc}/lb/status", {"status": {"loadBalancer": {"ingress": [
            {"ip": "203.0.113.20"}, {"hostname": "lb.example.com"}, {"ip": "203.0.113.5"}]}}})  # fmt: skip
        del lb
        self.api.create(svc, {"metadata": {"name": "pending-lb"}, "spec": {
            "type": "LoadBalancer", "ports": [{"port": 443}], "externalIPs": ["198.51.100.8"]}})  # fmt: skip
        self.api.create(svc, {"metadata": {"name": "pending-lb2"}, "spec": {"type": "LoadBalancer",
                                                                           "ports": [{"port": 443}]}})  # fmt: skip
        self.api.create(svc, {"metadata": {"name": "external"}, "spec": {
            "type": "ExternalName", "externalName": "db.example.com"}})  # fmt: skip
        self.api.create(svc, {"metadata": {"name": "headless"}, "spec": {
            "clusterIP": "None", "selector": {"app": "db"}}})  # fmt: skip

    def endpoints(self) -> None:
        ep = self.path("endpoints")
        addresses = [{"ip": f"10.0.0.{i}"} for i in range(1, 6)]
        self.api.create(ep, {"metadata": {"name": "many"}, "subsets": [
            {"addresses": addresses,
             "ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}]})  # fmt: skip
        self.api.create(ep, {"metadata": {"name": "noports"}, "subsets": [{"addresses": addresses[:2]}]})
        self.api.create(ep, {"metadata": {"name": "v6"}, "subsets": [
            {"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 8443}]}]})  # fmt: skip
        self.api.create(ep, {"metadata": {"name": "none"}})
        self.api.create(ep, {"metadata": {"name": "notready"}, "subsets": [
            {"notReadyAddresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 80}]}]})  # fmt: skip
        slices = self.path("endpointslices", "discovery.k8s.io")
        self.api.create(slices, {"metadata": {"name": "many"}, "addressType": "IPv4",
                                 "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}, {"name": "c"},
                                           {"port": 83}, {"name": "e", "port": 84}],
                                 "endpoints": [{"addresses": ["10.0.0.1", "10.0.0.2"]},
                                               {"addresses": ["10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]})  # fmt: skip
        self.api.create(slices, {"metadata": {"name": "empty"}, "addressType": "IPv6", "endpoints": []})
        self.api.create(slices, {"metadata": {"name": "fqdn"}, "addressType": "FQDN", "ports": [{}],
                                 "endpoints": [{"addresses": ["a.example.com"]}]})  # fmt: skip

    # ------------------------------------------------------------------ pods

    def pods(self) -> None:
        node = self.node_names()[0]
        tolerate = [{"operator": "Exists"}]
        base = {"containers": [{"name": "app", "image": "registry.example.com/app:1"}], "tolerations": tolerate}
        two = {**base, "containers": [{"name": "app", "image": "app:1"}, {"name": "side", "image": "side:2"}]}
        inits = {
            **base,
            "initContainers": [{"name": "init-a", "image": "init:1"}, {"name": "init-b", "image": "init:2"}],
        }
        sidecar = {**base, "initContainers": [{"name": "proxy", "image": "proxy:1", "restartPolicy": "Always"}]}

        def running(name: str, **extra: Any) -> dict[str, Any]:
            return {"name": name, "image": "x", "imageID": "", "ready": True, "started": True, "restartCount": 0,
                    "state": {"running": {"startedAt": stamp(60)}}, **extra}  # fmt: skip

        def cond(kind: str, status: str = "True", **extra: str) -> dict[str, Any]:
            return {"type": kind, "status": status, "lastTransitionTime": stamp(60), **extra}

        ready_conds = [cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")]
        term = {"exitCode": 1, "reason": "Error", "startedAt": stamp(400), "finishedAt": stamp(300)}
        pods: list[tuple[str, dict[str, Any], dict[str, Any] | None, dict[str, Any]]] = [
            # name, spec, status (None: leave it to the scheduler), metadata extras
            ("pending", {**base, "nodeSelector": {"example.com/nowhere": "x"}}, None, {}),
            ("running", {**base, "nodeName": node}, {
                "phase": "Running", "conditions": ready_conds, "podIP": "10.244.0.5",
                "podIPs": [{"ip": "10.244.0.5"}, {"ip": "fd00::5"}], "containerStatuses": [running("app")]}, {}),
            ("restarted", {**two, "nodeName": node}, {
                "phase": "Running", "conditions": ready_conds, "podIP": "10.244.0.6",
                "containerStatuses": [running("app", restartCount=3, lastState={"terminated": term}),
                                      running("side", restartCount=2, lastState={"terminated": {
                                          **term, "finishedAt": stamp(3700)}})]}, {}),
            ("crashloop", {**base, "nodeName": node}, {
                "phase": "Running", "conditions": [cond("Ready", "False")],
                "containerStatuses": [{**running("app", restartCount=7, ready=False, lastState={"terminated": term}),
                                       "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "started": False}]}, {}),
            ("init-waiting", {**inits, "nodeName": node}, {
                "phase": "Pending", "conditions": [cond("Initialized", "False")],
                "initContainerStatuses": [
                    {"name": "init-a", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                     "state": {"waiting": {"reason": "PodInitializing"}}},
                    {"name": "init-b", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                     "state": {"waiting": {"reason": "PodInitializing"}}}]}, {}),
            ("init-crash", {**inits, "nodeName": node}, {
                "phase": "Pending", "conditions": [cond("Initialized", "False")],
                "initContainerStatuses": [
                    {"name": "init-a", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp(30)}}},
                    {"name": "init-b", "image": "x", "imageID": "", "ready": False, "restartCount": 4,
                     "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": term}}]}, {}),
            ("init-signal", {**inits, "nodeName": node}, {
                "phase": "Pending", "initContainerStatuses": [
                    {"name": "init-a", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}, {}),
            ("sidecar", {**sidecar, "nodeName": node}, {
                "phase": "Running", "conditions": ready_conds, "podIP": "10.244.0.9",
                "initContainerStatuses": [
                    {**running("proxy", restartCount=1, lastState={"terminated": term})}],
                "containerStatuses": [running("app")]}, {}),
            ("completed", {**base, "nodeName": node, "restartPolicy": "Never"}, {
                "phase": "Succeeded", "containerStatuses": [{**running("app", ready=False), "started": False,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp(10)}}}]}, {}),
            ("failed", {**base, "nodeName": node, "restartPolicy": "Never"}, {
                "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
                "containerStatuses": [{**running("app", ready=False), "started": False,
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}, {}),
            ("killed", {**two, "nodeName": node, "restartPolicy": "Never"}, {
                "phase": "Failed", "containerStatuses": [
                    {**running("app", ready=False), "started": False, "state": {"terminated": {"exitCode": 2}}},
                    {**running("side", ready=False), "started": False,
                     "state": {"terminated": {"exitCode": 0, "signal": 15}}}]}, {}),
            ("notready", {**two, "nodeName": node}, {
                "phase": "Running", "conditions": [cond("Ready", "False")], "containerStatuses": [
                    running("app"),
                    {**running("side", ready=False), "started": False,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}, {}),
            ("gates", {**base, "nodeName": node, "readinessGates": [
                {"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"},
                {"conditionType": "example.com/missing"}]}, {
                "phase": "Running", "conditions": [*ready_conds, cond("example.com/lb"),
                                                   cond("example.com/dns", "False")],
                "containerStatuses": [running("app")]}, {}),
            ("gated", {**base, "schedulingGates": [{"name": "example.com/wait"}]}, None, {}),
            ("nominated", {**base, "nodeSelector": {"example.com/nowhere": "x"}},
             {"phase": "Pending", "nominatedNodeName": node}, {}),
            ("terminating", {**base, "nodeName": node}, {
                "phase": "Running", "conditions": ready_conds, "containerStatuses": [running("app")]},
             {"finalizers": [HOLD]}),
            ("nodelost", {**base, "nodeName": node}, {
                "phase": "Running", "reason": "NodeLost", "containerStatuses": [running("app")]},
             {"finalizers": [HOLD]}),
        ]  # fmt: skip
        path = self.path("pods")
        for name, spec, status, meta in pods:
            self.api.create(path, {"metadata": {"name": name, "labels": {"state": name}, **meta}, "spec": spec})
            if status is not None:
                self.api.merge_patch(f"{path}/{name}/status", {"status": status})
        for name in ("terminating", "nodelost"):
            self.api.delete(f"{path}/{name}", gracePeriodSeconds=30)

    # ------------------------------------------------------------------ custom resources

    def crd_names(self) -> list[str]:
        return [f"widgets.{self.crd_group}", f"plains.{self.crd_group}"]

    def crd(self) -> dict[str, Any]:
        columns_v1 = [
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                "description": "Whether the widget is ready",
            },
            {"name": "Size", "type": "number", "jsonPath": ".spec.size"},
            {"name": "Enabled", "type": "boolean", "jsonPath": ".spec.enabled"},
            {"name": "Started", "type": "date", "jsonPath": ".status.startedAt"},
            {"name": "Selector", "type": "string", "jsonPath": ".spec.selector", "priority": 1},
            {"name": "Tags", "type": "string", "jsonPath": ".spec.tags", "priority": 1},
            {"name": "Ratio", "type": "string", "jsonPath": ".spec.ratio", "priority": 1},
            {"name": "Second", "type": "string", "jsonPath": ".spec.items[1]", "priority": 1},
            {"name": "Kind", "type": "string", "jsonPath": ".kind", "priority": 1, "format": "byte"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
        columns_v2 = [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Count", "type": "integer", "jsonPath": ".spec.size"},
        ]
        schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.crd_names()[0]},
            "spec": {
                "group": self.crd_group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [
                    {"name": "v1", "served": True, "storage": True, "schema": schema,
                     "additionalPrinterColumns": columns_v1},
                    {"name": "v2", "served": True, "storage": False, "schema": schema,
                     "additionalPrinterColumns": columns_v2},
                ],
            },
        }  # fmt: skip

    def plain_crd(self) -> dict[str, Any]:
        """No printer columns: kube serves one ``Age`` column. Cluster-scoped."""
        schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.crd_names()[1]},
            "spec": {
                "group": self.crd_group,
                "scope": "Cluster",
                "names": {"plural": "plains", "singular": "plain", "kind": "Plain", "listKind": "PlainList"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
            },
        }

    def crds(self) -> None:
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for crd in (self.crd(), self.plain_crd()):
            crd["metadata"]["labels"] = {self.label: "crd"}
            self.api.create(crds, crd)
        group = self.crd_group
        wait_for(lambda: self.api.raw("GET", f"/apis/{group}/v1/widgets")[0] == 200, 30, "widgets served")
        wait_for(lambda: self.api.raw("GET", f"/apis/{group}/v1/plains")[0] == 200, 30, "plains served")
        widgets = self.path("widgets", group)
        items = [
            ("full", {"replicas": 3, "size": 2.5, "enabled": True, "selector": {"app": "w", "a<b": "&"},
                      "tags": ["a", "b"], "ratio": 1e-05, "items": ["x", "y"]},
             {"conditions": [{"type": "Progressing", "status": "True"}, {"type": "Ready", "status": "False"}],
              "startedAt": stamp(4000), "phase": "Running"}),
            ("sparse", {"size": 3}, None),
            ("odd", {"replicas": 2.9, "size": "big", "enabled": "yes", "ratio": 1000000.0, "tags": [],
                     "selector": None, "items": ["only"]},
             {"startedAt": "yesterday", "conditions": [{"type": "Ready", "status": True}]}),
            ("zero", {"replicas": 0, "size": 0, "enabled": False, "ratio": 123456789.0},
             {"startedAt": "0001-01-01T00:00:00Z", "conditions": "none"}),
        ]  # fmt: skip
        for name, spec, status in items:
            body: dict[str, Any] = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name},
                                    "spec": spec}  # fmt: skip
            if status is not None:
                body["status"] = status
            self.api.create(widgets, body)
        for name in ("alpha", "beta"):
            self.api.create(f"/apis/{group}/v1/plains", {"apiVersion": f"{group}/v1", "kind": "Plain",
                                                        "metadata": {"name": f"{self.prefix}-{name}"}})  # fmt: skip
            self.made.append(f"/apis/{group}/v1/plains/{self.prefix}-{name}")

    # ------------------------------------------------------------------ workloads

    def workloads(self) -> None:
        apps = lambda r: self.path(r, "apps")  # noqa: E731
        selector = {self.label: "1"}

        def template(app: str, image: str = "nginx:1.27") -> dict[str, Any]:
            return {"metadata": {"labels": {"app": app}}, "spec": {
                "nodeSelector": selector, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "web", "image": image}, {"name": "log", "image": "busybox:1"}]}}  # fmt: skip

        self.api.create(apps("deployments"), {"metadata": {"name": "web"}, "spec": {
            "replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template("web")}})  # fmt: skip
        self.api.create(apps("deployments"), {"metadata": {"name": "expr"}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "expr"}, "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["b", "a"]},
                {"key": "app", "operator": "Exists"}]},
            "template": template("expr")}})  # fmt: skip
        self.api.create(apps("replicasets"), {"metadata": {"name": "bare"}, "spec": {
            "replicas": 2, "selector": {"matchExpressions": [{"key": "app", "operator": "In",
                                                              "values": ["bare", "also"]}]},
            "template": template("bare")}})  # fmt: skip
        self.api.create(apps("statefulsets"), {"metadata": {"name": "db"}, "spec": {
            "replicas": 2, "serviceName": "headless", "selector": {"matchLabels": {"app": "db"}},
            "template": template("db", "postgres:16")}})  # fmt: skip
        self.api.create(apps("daemonsets"), {"metadata": {"name": "agent"}, "spec": {
            "selector": {"matchLabels": {"app": "agent"}}, "template": template("agent", "agent:3")}})  # fmt: skip
        wait_for(lambda: self._rolled_out("web", 3), 60, "deployment web available")
        # a new revision, caught mid-rollout
        self.api.merge_patch(f"{apps('deployments')}/web", {"spec": {"template": {"spec": {
            "containers": [{"name": "web", "image": "nginx:1.28"},
                           {"name": "log", "image": "busybox:1"}]}}}})  # fmt: skip
        self.api.merge_patch(f"{apps('statefulsets')}/db", {"spec": {"template": {"spec": {
            "containers": [{"name": "web", "image": "postgres:17"},
                           {"name": "log", "image": "busybox:1"}]}}}})  # fmt: skip
        wait_for(lambda: len(self.api.get(apps("replicasets"))["items"]) >= 4, 30, "the new replica set")

    def _rolled_out(self, name: str, replicas: int) -> bool:
        try:
            status = self.api.get(f"{self.path('deployments', 'apps')}/{name}").get("status", {})
        except ApiError:
            return False
        return status.get("availableReplicas", 0) >= replicas


@dataclass(frozen=True)
class Target:
    """A collection whose Tables are compared: kube's resource and a path to LIST it."""

    name: str
    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    path: str
    query: tuple[tuple[str, str], ...] = ()

    @property
    def resource_id(self) -> str:
        return f"{self.group}/{self.version}/{self.resource}" if self.group else self.resource


def targets(s: Scenario) -> list[Target]:
    """What the scenario made, per kind, in the scenario's namespace (or selected by its labels)."""
    ns = s.ns
    mine = (("labelSelector", s.label),)  # nodes: the scenario's own (the kit is shared)

    def namespaced(resource: str, kind: str, group: str = "", version: str = "v1") -> Target:
        return Target(resource, group, version, resource, kind, True, s.path(resource, group, version))

    return [
        namespaced("pods", "Pod"),
        Target("nodes", "", "v1", "nodes", "Node", False, "/api/v1/nodes", mine),
        Target("namespaces", "", "v1", "namespaces", "Namespace", False, "/api/v1/namespaces",
               (("labelSelector", f"kubernetes.io/metadata.name in (default,kube-system,{ns})"),)),
        namespaced("services", "Service"),
        namespaced("configmaps", "ConfigMap"),
        namespaced("secrets", "Secret"),
        namespaced("serviceaccounts", "ServiceAccount"),
        namespaced("endpoints", "Endpoints"),
        namespaced("endpointslices", "EndpointSlice", "discovery.k8s.io"),
        namespaced("deployments", "Deployment", "apps"),
        namespaced("replicasets", "ReplicaSet", "apps"),
        namespaced("statefulsets", "StatefulSet", "apps"),
        namespaced("daemonsets", "DaemonSet", "apps"),
        namespaced("controllerrevisions", "ControllerRevision", "apps"),
        Target("widgets", s.crd_group, "v1", "widgets", "Widget", True, s.path("widgets", s.crd_group)),
        Target("widgets-v2", s.crd_group, "v2", "widgets", "Widget", True, s.path("widgets", s.crd_group, "v2")),
        Target("plains", s.crd_group, "v1", "plains", "Plain", False, f"/apis/{s.crd_group}/v1/plains"),
        Target("customresourcedefinitions", "apiextensions.k8s.io", "v1", "customresourcedefinitions",
               "CustomResourceDefinition", False, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
               (("labelSelector", s.label),)),
        namespaced("roles", "Role", "rbac.authorization.k8s.io"),
    ]  # fmt: skip

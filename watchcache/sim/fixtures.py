"""Realistic object bodies for the sim: sizes and shapes like a real cluster's.

Cache memory, encode cost and LIST/watch throughput all scale with object size, so a
load test on 200-byte toy pods says little. A pod here is about 3 KB of JSON (what a
typical Deployment-managed pod weighs without managedFields), with the nesting and
field mix (labels, owner references, probes, statuses) selectors and encoders meet in
production. Everything is drawn from the ``random.Random`` passed in, so a seed
reproduces a cluster exactly. Server-set fields (uid, resourceVersion,
creationTimestamp) are left to the sim.

Times a kubelet would record (containers started, the last restart, conditions) are
``started``: the sim passes its wall clock when it makes the object, so ``kubectl get
pods`` shows ``RESTARTS 2 (7s ago)`` beside ``AGE 7s``, never a date years before the
pod. Callers that compare objects (tests, benchmarks) get a fixed default.
"""

from __future__ import annotations

import functools
import random
import time
import uuid
from typing import Any

APPS = ("frontend", "checkout", "catalog", "payments", "search", "auth", "ledger", "mailer", "gateway", "metrics")
TIERS = ("web", "backend", "cache", "worker")
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
FIXED_START = "2024-05-01T12:00:00Z"


def timestamp(wall: float) -> str:
    """An RFC 3339 time in whole seconds, as kube serialises ``metav1.Time``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def random_suffix(rng: random.Random, n: int = 5) -> str:
    """A kube-style generated suffix (``utilrand.String``'s alphabet)."""
    return "".join(rng.choices(_HASH_ALPHABET, k=n))


@functools.lru_cache(maxsize=1024)
def pod_template_hash(app: str) -> str:
    """A stable ReplicaSet hash per app, so pods of one app share their owner like real ones."""
    return random_suffix(random.Random(app), 10)


def make_namespace(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"team": name.split("-")[0]}}}


def make_configmap(name: str, namespace: str, rng: random.Random) -> dict[str, Any]:
    settings = "\n".join(f"{k}={rng.randint(1, 1000)}" for k in ("workers", "timeout_ms", "cache_size", "max_conns"))
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "watchcache-sim"},
        },
        "data": {
            "app.properties": settings,
            "log_level": rng.choice(("debug", "info", "warn")),
            "feature_flags": ",".join(rng.sample(("beta-ui", "fast-path", "new-search", "dark-mode", "v2-api"), 3)),
        },
    }


def make_node(name: str, rng: random.Random, *, started: str = FIXED_START) -> dict[str, Any]:
    zone = rng.choice(ZONES)
    cpu, mem = rng.choice(((4, 16), (8, 32), (16, 64)))
    ip = f"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    conditions = [
        _condition(t, "False", r, started)
        for t, r in (
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        )
    ]
    conditions.append(_condition("Ready", "True", "KubeletReady", started))
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": f"m5.{cpu // 4}xlarge",
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": zone[:-1],
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": f"10.244.{rng.randint(0, 255)}.0/24",
            "providerID": f"aws:///{zone}/i-{rng.getrandbits(64):016x}",
        },
        "status": {
            "capacity": {"cpu": str(cpu), "memory": f"{mem}Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {
                "cpu": f"{cpu * 1000 - 100}m",
                "memory": f"{mem - 1}Gi",
                "pods": "110",
                "ephemeral-storage": "95Gi",
            },
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "kubeletVersion": "v1.30.2",
                "containerRuntimeVersion": "containerd://1.7.18",
                "kernelVersion": "6.1.94",
                "osImage": "Ubuntu 22.04.4 LTS",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def make_pod(
    name: str, namespace: str, node: str, rng: random.Random, *, app: str | None = None, started: str = FIXED_START
) -> dict[str, Any]:
    """A Running pod of ``app`` (drawn from ``rng`` if not given), owned by its app's ReplicaSet,
    its containers running since ``started`` (restarted ones: their last exit at ``started`` too)."""
    app = app or rng.choice(APPS)
    rs_hash = pod_template_hash(app)
    tier = TIERS[sum(map(ord, app)) % len(TIERS)]
    pod_ip = f"10.244.{rng.randint(0, 255)}.{rng.randint(2, 254)}"
    host_ip = f"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    containers = [_container(app, rng, main=True)]
    if rng.random() < 0.3:
        containers.append(_container("istio-proxy", rng, main=False))
    statuses = [
        {
            "name": c["name"],
            "state": {"running": {"startedAt": started}},
            "ready": True,
            "restartCount": rng.randint(0, 3),
            "image": c["image"],
            "imageID": f"docker.io/library/{c['name']}@sha256:{rng.getrandbits(256):064x}",
            "containerID": f"containerd://{rng.getrandbits(256):064x}",
            "started": True,
        }
        for c in containers
    ]
    for status in statuses:
        if status["restartCount"]:
            # what a kubelet records of the last restart: kubectl shows it as RESTARTS "2 (5m ago)"
            last_exit = {"exitCode": 137, "reason": "OOMKilled", "startedAt": started, "finishedAt": started}
            status["lastState"] = {"terminated": last_exit}
    return {
        "metadata": {
            "name": name,
            "generateName": f"{app}-{rs_hash}-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": rs_hash, "tier": tier},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-{rs_hash}",
                    "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        ],
                        "defaultMode": 420,
                    },
                },
            ],
            "containers": containers,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": node,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 2000},
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                _condition(t, "True", None, started)
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": host_ip,
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": started,
            "containerStatuses": statuses,
            "qosClass": "Burstable",
        },
    }


def _container(name: str, rng: random.Random, *, main: bool) -> dict[str, Any]:
    port = rng.choice((8080, 8443, 9000))
    container: dict[str, Any] = {
        "name": name,
        "image": f"registry.example.com/{name}:v1.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
        "resources": {
            "limits": {"cpu": f"{rng.choice((500, 1000, 2000))}m", "memory": f"{rng.choice((256, 512, 1024))}Mi"},
            "requests": {"cpu": f"{rng.choice((100, 250))}m", "memory": f"{rng.choice((128, 256))}Mi"},
        },
        "imagePullPolicy": "IfNotPresent",
    }
    if main:
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        container["terminationMessagePath"] = "/dev/termination-log"
        container["terminationMessagePolicy"] = "File"
        container["env"] = [
            {"name": "LOG_LEVEL", "value": rng.choice(("info", "debug"))},
            {"name": "GOMAXPROCS", "value": str(rng.randint(1, 4))},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        ]
        container["volumeMounts"] = [
            {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
            {"name": "config", "mountPath": "/etc/app"},
        ]
        probe = {"httpGet": {"path": "/healthz", "port": port, "scheme": "HTTP"}, "periodSeconds": 10}
        container["livenessProbe"] = {**probe, "initialDelaySeconds": 15, "failureThreshold": 3}
        container["readinessProbe"] = {**probe, "timeoutSeconds": 1, "successThreshold": 1}
    return container


def _condition(kind: str, status: str, reason: str | None, started: str) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": started}
    if reason:
        condition["reason"] = reason
    return condition

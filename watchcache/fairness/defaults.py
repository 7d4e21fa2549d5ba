"""kube-apiserver v1.36's bootstrap flow-control configuration: the mandatory and suggested objects.

Used when the upstream does not serve FlowSchemas and PriorityLevelConfigurations, or the proxy's
account may not read them (``/readyz?verbose`` says which). Written from what a v1.36
kube-apiserver creates at start (``kubectl get flowschemas,prioritylevelconfigurations``; kube's
``apis/flowcontrol/bootstrap/default.go``). kube gives each object a random UID; these get a
UID derived from their name, stable across restarts, so the PF response headers name the same
object from every worker.
"""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["MANDATORY_FLOW_SCHEMAS", "MANDATORY_PRIORITY_LEVELS", "flow_schemas", "priority_levels"]

_NS = uuid.UUID("6f1c1d0e-2a55-4d0f-9a8e-7a1a9a3cf0b1")
_ALL_RESOURCES = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
_ALL_URLS = {"verbs": ["*"], "nonResourceURLs": ["*"]}
_EVERYONE = [
    {"kind": "Group", "group": {"name": "system:unauthenticated"}},
    {"kind": "Group", "group": {"name": "system:authenticated"}},
]


def _meta(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "uid": str(uuid.uuid5(_NS, f"{kind}/{name}"))},
    }


def _level(name: str, shares: int, lendable: int, queuing: tuple[int, int, int] | None) -> dict[str, Any]:
    if queuing is None:
        response: dict[str, Any] = {"type": "Reject"}
    else:
        queues, hand, length = queuing
        response = {"type": "Queue", "queuing": {"queues": queues, "handSize": hand, "queueLengthLimit": length}}
    spec = {
        "type": "Limited",
        "limited": {"nominalConcurrencyShares": shares, "lendablePercent": lendable, "limitResponse": response},
    }
    return {**_meta("PriorityLevelConfiguration", name), "spec": spec}


def _schema(
    name: str, level: str, precedence: int, distinguisher: str | None, rules: list[dict[str, Any]]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "priorityLevelConfiguration": {"name": level},
        "matchingPrecedence": precedence,
        "rules": rules,
    }
    if distinguisher is not None:
        spec["distinguisherMethod"] = {"type": distinguisher}
    return {**_meta("FlowSchema", name), "spec": spec}


def _everything(*subjects: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"subjects": list(subjects), "resourceRules": [_ALL_RESOURCES], "nonResourceRules": [_ALL_URLS]}]


def _user(name: str) -> dict[str, Any]:
    return {"kind": "User", "user": {"name": name}}


def _group(name: str) -> dict[str, Any]:
    return {"kind": "Group", "group": {"name": name}}


def _sa(namespace: str, name: str) -> dict[str, Any]:
    return {"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": name}}


MANDATORY_PRIORITY_LEVELS: list[dict[str, Any]] = [
    {
        **_meta("PriorityLevelConfiguration", "exempt"),
        "spec": {"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}},
    },
    _level("catch-all", 5, 0, None),
]

MANDATORY_FLOW_SCHEMAS: list[dict[str, Any]] = [
    _schema("exempt", "exempt", 1, None, _everything(_group("system:masters"))),
    _schema("catch-all", "catch-all", 10_000, "ByUser", _everything(*_EVERYONE)),
]

_SUGGESTED_LEVELS = [
    _level("system", 30, 33, (64, 6, 50)),
    _level("node-high", 40, 25, (64, 6, 50)),
    _level("leader-election", 10, 0, (16, 4, 50)),
    _level("workload-high", 40, 50, (128, 6, 50)),
    _level("workload-low", 100, 90, (128, 6, 50)),
    _level("global-default", 20, 50, (128, 6, 50)),
]

_SUGGESTED_SCHEMAS = [
    _schema(
        "probes",
        "exempt",
        2,
        None,
        [
            {
                "subjects": _EVERYONE,
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}],
            }
        ],
    ),
    _schema(
        "system-leader-election",
        "leader-election",
        100,
        "ByUser",
        [
            {
                "subjects": [
                    _user("system:kube-controller-manager"),
                    _user("system:kube-scheduler"),
                    _sa("kube-system", "*"),
                ],
                "resourceRules": [
                    {
                        "verbs": ["get", "create", "update"],
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "namespaces": ["*"],
                    }
                ],
            }
        ],
    ),
    _schema(
        "system-node-high",
        "node-high",
        400,
        "ByUser",
        [
            {
                "subjects": [_group("system:nodes")],
                "resourceRules": [
                    {
                        "verbs": ["*"],
                        "apiGroups": [""],
                        "resources": ["nodes", "nodes/status"],
                        "clusterScope": True,
                        "namespaces": ["*"],
                    },
                    {
                        "verbs": ["*"],
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "namespaces": ["*"],
                    },
                ],
            }
        ],
    ),
    _schema("system-nodes", "system", 500, "ByUser", _everything(_group("system:nodes"))),
    _schema(
        "kube-controller-manager",
        "workload-high",
        800,
        "ByNamespace",
        _everything(_user("system:kube-controller-manager")),
    ),
    _schema("kube-scheduler", "workload-high", 800, "ByNamespace", _everything(_user("system:kube-scheduler"))),
    _schema("kube-system-service-accounts", "workload-high", 900, "ByNamespace", _everything(_sa("kube-system", "*"))),
    _schema("service-accounts", "workload-low", 9000, "ByUser", _everything(_group("system:serviceaccounts"))),
    _schema("global-default", "global-default", 9900, "ByUser", _everything(*_EVERYONE)),
]


def priority_levels() -> list[dict[str, Any]]:
    """The mandatory and suggested PriorityLevelConfigurations, as the API serves them."""
    return [*MANDATORY_PRIORITY_LEVELS, *_SUGGESTED_LEVELS]


def flow_schemas() -> list[dict[str, Any]]:
    """The mandatory and suggested FlowSchemas, as the API serves them."""
    return [*MANDATORY_FLOW_SCHEMAS, *_SUGGESTED_SCHEMAS]

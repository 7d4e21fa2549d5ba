"""FlowSchemas and PriorityLevelConfigurations (``flowcontrol.apiserver.k8s.io/v1``) as plain values.

``parse_flow_schema`` and ``parse_priority_level`` read an object as the upstream serves it (JSON
decoded) and raise ``ValueError`` for one kube's validation would refuse, or that this reading
cannot follow: the caller skips it, logs and counts it (a bad object must never stop the others).
Defaults are v1's (``pkg/apis/flowcontrol/v1/defaults.go``): matchingPrecedence 1000,
nominalConcurrencyShares 30, queues 64, handSize 8, queueLengthLimit 50.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FlowSchema",
    "NonResourceRule",
    "PolicyRule",
    "PriorityLevel",
    "ResourceRule",
    "Subject",
    "parse_flow_schema",
    "parse_priority_level",
]

#: ``*``: any verb, group, resource, namespace, URL, user or group (kube's ``NameAll`` and friends).
ALL = "*"
_MAX_PRECEDENCE = 10_000
_MAX_ENTROPY_BITS = 60  # kube's validation: a hand is dealt from at most 60 bits of the flow's hash


@dataclass(frozen=True, slots=True)
class Subject:
    """A subject of a rule: ``kind`` User, Group or ServiceAccount; ``namespace`` for a ServiceAccount."""

    kind: str
    name: str
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class ResourceRule:
    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    cluster_scope: bool
    namespaces: frozenset[str]


@dataclass(frozen=True, slots=True)
class NonResourceRule:
    verbs: frozenset[str]
    urls: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PolicyRule:
    subjects: tuple[Subject, ...]
    resource_rules: tuple[ResourceRule, ...]
    non_resource_rules: tuple[NonResourceRule, ...]


@dataclass(frozen=True, slots=True)
class FlowSchema:
    name: str
    uid: str
    priority_level: str
    matching_precedence: int
    #: "ByUser", "ByNamespace", or "" (one flow for the whole schema).
    distinguisher: str
    rules: tuple[PolicyRule, ...]


@dataclass(frozen=True, slots=True)
class PriorityLevel:
    """A priority level; ``queues == 0`` for a Limited level whose limitResponse is Reject."""

    name: str
    uid: str
    exempt: bool
    nominal_concurrency_shares: int
    lendable_percent: int
    queues: int = 0
    hand_size: int = 0
    queue_length_limit: int = 0
    # None: no limit (the server's seats may be borrowed).
    borrowing_limit_percent: int | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """What a queue set is built from (a change of it means a new queue set)."""
        return self.queues, self.hand_size, self.queue_length_limit


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}: expected an object")
    return value


def _strings(value: Any, what: str, *, required: bool = True) -> tuple[str, ...]:
    if value is None:
        value = []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what}: expected a list of strings")
    if required and not value:
        raise ValueError(f"{what}: must not be empty")
    return tuple(value)


def _int(value: Any, what: str, default: int, low: int, high: int | None = None) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: expected an integer")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{what}: {value} out of range [{low}, {high if high is not None else 'inf'}]")
    return value


def _meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = _map(_map(obj, "object").get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: required")
    uid = meta.get("uid", "")
    return name, uid if isinstance(uid, str) else ""


def _subject(raw: Any) -> Subject:
    raw = _map(raw, "subject")
    kind = raw.get("kind")
    namespace: Any = ""
    if kind == "User":
        name = _map(raw.get("user"), "subject.user").get("name")
    elif kind == "Group":
        name = _map(raw.get("group"), "subject.group").get("name")
    elif kind == "ServiceAccount":
        sa = _map(raw.get("serviceAccount"), "subject.serviceAccount")
        name, namespace = sa.get("name"), sa.get("namespace")
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("subject.serviceAccount.namespace: required")
    else:
        raise ValueError(f"subject.kind: {kind!r} is not User, Group or ServiceAccount")
    if not isinstance(name, str) or not name:
        raise ValueError(f"subject of kind {kind}: name required")
    return Subject(kind, name, namespace)


def _rule(raw: Any) -> PolicyRule:
    raw = _map(raw, "rule")
    subjects = raw.get("subjects")
    if not isinstance(subjects, list) or not subjects:
        raise ValueError("rule.subjects: must not be empty")
    resource_rules = []
    for rr in raw.get("resourceRules") or []:
        rr = _map(rr, "resourceRule")
        namespaces = frozenset(_strings(rr.get("namespaces"), "resourceRule.namespaces", required=False))
        cluster_scope = rr.get("clusterScope") is True
        if not namespaces and not cluster_scope:
            raise ValueError("resourceRule: namespaces empty and clusterScope false match nothing")
        resource_rules.append(
            ResourceRule(
                verbs=frozenset(_strings(rr.get("verbs"), "resourceRule.verbs")),
                api_groups=frozenset(_strings(rr.get("apiGroups"), "resourceRule.apiGroups")),
                resources=frozenset(_strings(rr.get("resources"), "resourceRule.resources")),
                cluster_scope=cluster_scope,
                namespaces=namespaces,
            )
        )
    non_resource_rules = []
    for nr in raw.get("nonResourceRules") or []:
        nr = _map(nr, "nonResourceRule")
        non_resource_rules.append(
            NonResourceRule(
                verbs=frozenset(_strings(nr.get("verbs"), "nonResourceRule.verbs")),
                urls=_strings(nr.get("nonResourceURLs"), "nonResourceRule.nonResourceURLs"),
            )
        )
    if not resource_rules and not non_resource_rules:
        raise ValueError("rule: at least one resourceRule or nonResourceRule required")
    return PolicyRule(tuple(_subject(s) for s in subjects), tuple(resource_rules), tuple(non_resource_rules))


def parse_flow_schema(obj: Mapping[str, Any]) -> FlowSchema:
    """A FlowSchema, or ``ValueError`` saying what is wrong with it."""
    name, uid = _meta(obj)
    try:
        spec = _map(obj.get("spec"), "spec")
        level = _map(spec.get("priorityLevelConfiguration"), "spec.priorityLevelConfiguration").get("name")
        if not isinstance(level, str) or not level:
            raise ValueError("spec.priorityLevelConfiguration.name: required")
        method = spec.get("distinguisherMethod")
        distinguisher = "" if method is None else _map(method, "spec.distinguisherMethod").get("type")
        if distinguisher not in ("", "ByUser", "ByNamespace"):
            raise ValueError(f"spec.distinguisherMethod.type: {distinguisher!r} is not ByUser or ByNamespace")
        rules = spec.get("rules") or []
        if not isinstance(rules, list):
            raise ValueError("spec.rules: expected a list")
        precedence = _int(spec.get("matchingPrecedence"), "spec.matchingPrecedence", 1000, 1, _MAX_PRECEDENCE)
        return FlowSchema(name, uid, level, precedence, distinguisher, tuple(_rule(r) for r in rules))
    except ValueError as e:
        raise ValueError(f"FlowSchema {name}: {e}") from None


def parse_priority_level(obj: Mapping[str, Any]) -> PriorityLevel:
    """A PriorityLevelConfiguration, or ``ValueError`` saying what is wrong with it."""
    name, uid = _meta(obj)
    try:
        spec = _map(obj.get("spec"), "spec")
        kind = spec.get("type")
        if kind == "Exempt":
            exempt = _map(spec.get("exempt"), "spec.exempt")
            shares = _int(exempt.get("nominalConcurrencyShares"), "spec.exempt.nominalConcurrencyShares", 0, 0)
            lendable = _int(exempt.get("lendablePercent"), "spec.exempt.lendablePercent", 0, 0, 100)
            return PriorityLevel(name, uid, True, shares, lendable)
        if kind != "Limited":
            raise ValueError(f"spec.type: {kind!r} is not Exempt or Limited")
        limited = _map(spec.get("limited"), "spec.limited")
        shares = _int(limited.get("nominalConcurrencyShares"), "spec.limited.nominalConcurrencyShares", 30, 0)
        lendable = _int(limited.get("lendablePercent"), "spec.limited.lendablePercent", 0, 0, 100)
        borrowing = limited.get("borrowingLimitPercent")
        if borrowing is not None:
            borrowing = _int(borrowing, "spec.limited.borrowingLimitPercent", 0, 0)
        response = _map(limited.get("limitResponse"), "spec.limited.limitResponse")
        how = response.get("type", "Reject")
        if how == "Reject":
            return PriorityLevel(name, uid, False, shares, lendable, borrowing_limit_percent=borrowing)
        if how != "Queue":
            raise ValueError(f"spec.limited.limitResponse.type: {how!r} is not Queue or Reject")
        q = _map(response.get("queuing"), "spec.limited.limitResponse.queuing")
        queues = _int(q.get("queues"), "queuing.queues", 64, 1)
        hand = _int(q.get("handSize"), "queuing.handSize", 8, 1, queues)
        if math.ceil(math.log2(queues) * hand) > _MAX_ENTROPY_BITS:
            raise ValueError(f"queuing: {queues} queues and handSize {hand} need more than 60 bits of hash")
        length = _int(q.get("queueLengthLimit"), "queuing.queueLengthLimit", 50, 1)
        return PriorityLevel(name, uid, False, shares, lendable, queues, hand, length, borrowing)
    except ValueError as e:
        raise ValueError(f"PriorityLevelConfiguration {name}: {e}") from None

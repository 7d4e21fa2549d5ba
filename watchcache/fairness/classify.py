"""Classification: which FlowSchema a request matches, so which priority level and which flow.

As kube's ``apf_controller``: schemas are tried in order of (matchingPrecedence, name), the first
whose rule matches wins; a rule matches when one of its subjects is the user and (for a resource
request) one of its resourceRules, or (otherwise) one of its nonResourceRules, matches the request
(``rule.go``). A schema naming a priority level that does not exist is dangling and skipped; the
mandatory ``exempt`` and ``catch-all`` objects are added where the configuration lacks them, so
every request is classified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from watchcache.fairness.config import (
    ALL,
    FlowSchema,
    NonResourceRule,
    PolicyRule,
    PriorityLevel,
    ResourceRule,
    Subject,
    parse_flow_schema,
    parse_priority_level,
)
from watchcache.fairness.defaults import MANDATORY_FLOW_SCHEMAS, MANDATORY_PRIORITY_LEVELS

__all__ = ["Classification", "Classifier", "RequestDigest"]

_SA_PREFIX = "system:serviceaccount:"


class RequestDigest(NamedTuple):
    """What classification reads of a request: its user and its attributes (kube's RequestInfo).

    A named tuple, not a frozen dataclass: one is made and hashed (the classification's memo key)
    per request, 0.6 µs against 1.7."""

    user: str
    groups: tuple[str, ...]
    verb: str
    resource_request: bool
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class Classification:
    flow_schema: FlowSchema
    priority_level: PriorityLevel
    #: The flow distinguisher: the user (ByUser), the namespace (ByNamespace), or "".
    distinguisher: str


def _subject_matches(subject: Subject, digest: RequestDigest) -> bool:
    if subject.kind == "User":
        return subject.name == ALL or subject.name == digest.user
    if subject.kind == "Group":
        return subject.name == ALL or subject.name in digest.groups
    # ServiceAccount: its user name is system:serviceaccount:<namespace>:<name>; name * is any in the namespace.
    prefix = f"{_SA_PREFIX}{subject.namespace}:"
    if not digest.user.startswith(prefix):
        return False
    return subject.name == ALL or digest.user[len(prefix) :] == subject.name


def _resource_rule_matches(rule: ResourceRule, d: RequestDigest) -> bool:
    if ALL not in rule.verbs and d.verb not in rule.verbs:
        return False
    if ALL not in rule.api_groups and d.api_group not in rule.api_groups:
        return False
    wanted = f"{d.resource}/{d.subresource}" if d.subresource else d.resource
    if ALL not in rule.resources and wanted not in rule.resources:
        return False
    if not d.namespace:
        return rule.cluster_scope
    return ALL in rule.namespaces or d.namespace in rule.namespaces


def _url_matches(pattern: str, path: str) -> bool:
    if pattern in (ALL, path):
        return True
    return pattern.endswith("*") and path.startswith(pattern[:-1])


def _non_resource_rule_matches(rule: NonResourceRule, d: RequestDigest) -> bool:
    if ALL not in rule.verbs and d.verb not in rule.verbs:
        return False
    return any(_url_matches(p, d.path) for p in rule.urls)


def rule_matches(rule: PolicyRule, digest: RequestDigest) -> bool:
    if not any(_subject_matches(s, digest) for s in rule.subjects):
        return False
    if digest.resource_request:
        return any(_resource_rule_matches(r, digest) for r in rule.resource_rules)
    return any(_non_resource_rule_matches(r, digest) for r in rule.non_resource_rules)


class Classifier:
    """One configuration's schemas in matching order, with their levels."""

    __slots__ = ("_memo", "levels", "schemas")

    #: Classifications remembered (a request's digest repeats: the same clients ask the same things).
    MEMO = 4096

    def __init__(self, schemas: Iterable[FlowSchema], levels: Iterable[PriorityLevel]) -> None:
        by_name = {level.name: level for level in levels}
        for raw in MANDATORY_PRIORITY_LEVELS:
            mandatory = parse_priority_level(raw)
            by_name.setdefault(mandatory.name, mandatory)
        named = {schema.name: schema for schema in schemas}
        for raw in MANDATORY_FLOW_SCHEMAS:
            mandatory_fs = parse_flow_schema(raw)
            named.setdefault(mandatory_fs.name, mandatory_fs)
        self.levels: dict[str, PriorityLevel] = by_name
        # Dangling schemas (their level does not exist) match nothing, as kube's.
        self.schemas: list[FlowSchema] = sorted(
            (s for s in named.values() if s.priority_level in by_name),
            key=lambda s: (s.matching_precedence, s.name),
        )
        self._memo: dict[RequestDigest, Classification] = {}

    def classify(self, digest: RequestDigest) -> Classification:
        known = self._memo.get(digest)
        if known is None:
            if len(self._memo) >= self.MEMO:
                self._memo.clear()  # bounded whatever users and paths clients send
            known = self._memo[digest] = self._match(digest)
        return known

    def _match(self, digest: RequestDigest) -> Classification:
        for schema in self.schemas:
            if any(rule_matches(rule, digest) for rule in schema.rules):
                if schema.distinguisher == "ByUser":
                    distinguisher = digest.user
                elif schema.distinguisher == "ByNamespace":
                    distinguisher = digest.namespace
                else:
                    distinguisher = ""
                return Classification(schema, self.levels[schema.priority_level], distinguisher)
        # Only when an operator's catch-all matches less than kube's: kube's own, as a last resort.
        return Classification(_CATCH_ALL, self.levels.get("catch-all", _CATCH_ALL_LEVEL), digest.user)


_CATCH_ALL = parse_flow_schema(MANDATORY_FLOW_SCHEMAS[1])
_CATCH_ALL_LEVEL = parse_priority_level(MANDATORY_PRIORITY_LEVELS[1])

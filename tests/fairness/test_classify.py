"""Classification against kube's rules, with kube's suggested configuration (fairness/defaults.py)."""

from __future__ import annotations

import pytest

from watchcache.fairness.classify import Classifier, RequestDigest
from watchcache.fairness.config import parse_flow_schema, parse_priority_level
from watchcache.fairness.defaults import flow_schemas, priority_levels

AUTH = ("system:authenticated",)


def defaults() -> Classifier:
    return Classifier(
        [parse_flow_schema(o) for o in flow_schemas()], [parse_priority_level(o) for o in priority_levels()]
    )


def res(user: str, groups: tuple[str, ...], verb: str = "list", **kw: str) -> RequestDigest:
    return RequestDigest(user, groups, verb, True, **kw)


@pytest.mark.parametrize(
    ("digest", "schema", "level", "flow"),
    [
        (res("admin", ("system:masters", *AUTH), resource="pods"), "exempt", "exempt", ""),
        (RequestDigest("system:anonymous", ("system:unauthenticated",), "get", False, path="/readyz"), "probes",
         "exempt", ""),
        (RequestDigest("system:anonymous", ("system:unauthenticated",), "get", False, path="/version"),
         "global-default", "global-default", "system:anonymous"),
        (res("system:serviceaccount:team:noisy", ("system:serviceaccounts", "system:serviceaccounts:team", *AUTH),
             resource="pods", namespace="team"), "service-accounts", "workload-low",
         "system:serviceaccount:team:noisy"),
        (res("system:serviceaccount:kube-system:x", ("system:serviceaccounts", *AUTH), resource="pods",
             namespace="ns1"), "kube-system-service-accounts", "workload-high", "ns1"),
        (res("system:serviceaccount:kube-system:x", ("system:serviceaccounts", *AUTH), verb="update",
             api_group="coordination.k8s.io", resource="leases", namespace="kube-system"),
         "system-leader-election", "leader-election", "system:serviceaccount:kube-system:x"),
        (res("system:node:n1", ("system:nodes", *AUTH), verb="patch", resource="nodes", subresource="status"),
         "system-node-high", "node-high", "system:node:n1"),
        (res("system:node:n1", ("system:nodes", *AUTH), resource="pods"), "system-nodes", "system", "system:node:n1"),
        (res("system:kube-scheduler", AUTH, resource="pods"), "kube-scheduler", "workload-high", ""),
        (res("alice", AUTH, resource="pods", namespace="a"), "global-default", "global-default", "alice"),
    ],
)  # fmt: skip
def test_suggested_configuration_classifies_as_kube(digest: RequestDigest, schema: str, level: str, flow: str) -> None:
    c = defaults().classify(digest)
    assert (c.flow_schema.name, c.priority_level.name, c.distinguisher) == (schema, level, flow)


def fs(name: str, precedence: int, rules: list[dict], level: str = "global-default") -> dict:
    return {
        "metadata": {"name": name, "uid": name + "-uid"},
        "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence, "rules": rules},
    }


def test_precedence_then_name_and_dangling_skipped() -> None:
    anything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"]}
    everyone = [{"subjects": [{"kind": "Group", "group": {"name": "*"}}], "resourceRules": [anything]}]
    levels = [parse_priority_level(o) for o in priority_levels()]
    schemas = [fs("b", 50, everyone), fs("a", 50, everyone), fs("0-dangling", 10, everyone, level="nope")]
    c = Classifier([parse_flow_schema(o) for o in schemas], levels)
    assert c.classify(res("u", AUTH, namespace="x", resource="pods")).flow_schema.name == "a"
    # namespaces ["*"] without clusterScope: a cluster-scoped request falls through to catch-all.
    assert c.classify(res("u", AUTH, resource="nodes")).flow_schema.name == "catch-all"


def test_rule_details() -> None:
    rules = [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": "n", "name": "sa"}}],
              "resourceRules": [{"verbs": ["get"], "apiGroups": ["apps"], "resources": ["deployments/scale"],
                                 "namespaces": ["n"]}],
              "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/apis/*"]}]}]  # fmt: skip
    c = Classifier([parse_flow_schema(fs("x", 5, rules))], [parse_priority_level(o) for o in priority_levels()])
    sa = "system:serviceaccount:n:sa"
    hit = res(sa, AUTH, verb="get", api_group="apps", resource="deployments", subresource="scale", namespace="n")
    assert c.classify(hit).flow_schema.name == "x"
    for miss in (
        res(sa, AUTH, verb="get", api_group="apps", resource="deployments", namespace="n"),
        res(sa, AUTH, verb="list", api_group="apps", resource="deployments", subresource="scale", namespace="n"),
        res(sa, AUTH, verb="get", api_group="apps", resource="deployments", subresource="scale", namespace="m"),
        res("system:serviceaccount:n:other", AUTH, verb="get", api_group="apps", resource="deployments",
            subresource="scale", namespace="n"),
    ):  # fmt: skip
        assert c.classify(miss).flow_schema.name == "catch-all"
    assert c.classify(RequestDigest(sa, AUTH, "get", False, path="/apis/apps")).flow_schema.name == "x"
    assert c.classify(RequestDigest(sa, AUTH, "get", False, path="/api")).flow_schema.name == "catch-all"


def test_mandatory_objects_added_when_missing() -> None:
    c = Classifier([], [])
    assert set(c.levels) == {"exempt", "catch-all"}
    assert c.classify(res("admin", ("system:masters",), resource="pods")).priority_level.exempt
    assert c.classify(res("bob", AUTH, resource="pods")).flow_schema.name == "catch-all"


@pytest.mark.parametrize(
    "bad",
    [
        {"metadata": {}},
        {"metadata": {"name": "x"}, "spec": {}},
        {"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"}, "matchingPrecedence": 0}},
        {"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"},
                                             "distinguisherMethod": {"type": "ByColour"}}},
        {"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"}, "rules": [{"subjects": []}]}},
        {"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"},
                                             "rules": [{"subjects": [{"kind": "Robot"}], "resourceRules": []}]}},
        {"metadata": {"name": "x"}, "spec": {"priorityLevelConfiguration": {"name": "p"}, "rules": "nope"}},
    ],
)  # fmt: skip
def test_bad_flow_schemas_raise_value_error(bad: dict) -> None:
    with pytest.raises(ValueError):
        parse_flow_schema(bad)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "Sometimes"},
        {"type": "Limited", "limited": {"nominalConcurrencyShares": -1}},
        {"type": "Limited", "limited": {"lendablePercent": 101}},
        {"type": "Limited", "limited": {"limitResponse": {"type": "Queue", "queuing": {"queues": 4, "handSize": 5}}}},
        {"type": "Limited", "limited": {"limitResponse": {"type": "Queue", "queuing": {"queues": 1 << 20,
                                                                                          "handSize": 4}}}},
        {"type": "Limited", "limited": {"limitResponse": {"type": "Queue", "queuing": {"queueLengthLimit": 0}}}},
        {"type": "Limited", "limited": {"limitResponse": {"type": "Drop"}}},
        {"type": "Limited", "limited": {"nominalConcurrencyShares": "many"}},
    ],
)  # fmt: skip
def test_bad_priority_levels_raise_value_error(spec: dict) -> None:
    with pytest.raises(ValueError):
        parse_priority_level({"metadata": {"name": "p"}, "spec": spec})


def test_v1_defaults() -> None:
    level = parse_priority_level({"metadata": {"name": "p"}, "spec": {"type": "Limited", "limited": {
        "limitResponse": {"type": "Queue"}}}})  # fmt: skip
    assert (level.nominal_concurrency_shares, level.queues, level.hand_size, level.queue_length_limit) == (
        30,
        64,
        8,
        50,
    )

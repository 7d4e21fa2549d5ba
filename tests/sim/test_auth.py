"""The simulated cluster's policy file and review endpoints (TokenReview, SubjectAccessReview)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from watchcache.auth.review import ReviewError
from watchcache.sim.auth import ACCESS_REVIEW_PATH, TOKEN_REVIEW_PATH, LocalReviewClient, handle_review
from watchcache.sim.policy import Policy, PolicyError, PolicyUser, load_policy

EXAMPLE = Path(__file__).parents[2] / "watchcache" / "sim" / "policy-example.yaml"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(EXAMPLE)


# ------------------------------------------------------------------ loading and validation


def test_the_example_loads(policy: Policy) -> None:
    assert [u.name for u in policy.users] == [
        "alice",
        "bob",
        "carol",
        "dave",
        "erin",
        "admin",
        "prometheus",
        "system:serviceaccount:watchcache:watchcache",
    ]
    assert policy.authenticate("admin-token") == PolicyUser(
        "admin", "admin-token", "uid-admin", ("system:masters",), {}
    )
    assert policy.authenticate("nobody") is None
    assert policy.authenticate("") is None


def test_the_proxy_identity_can_review_and_read_what_it_caches_only(policy: Policy) -> None:
    proxy = policy.authenticate("watchcache-token")
    assert proxy is not None
    me, groups = proxy.name, [*proxy.groups, "system:authenticated"]
    assert policy.authorize(me, groups, "create", "authentication.k8s.io", "tokenreviews")[0]
    assert policy.authorize(me, groups, "create", "authorization.k8s.io", "subjectaccessreviews")[0]
    assert policy.authorize(me, groups, "watch", "apps", "deployments")[0]
    assert policy.authorize(me, groups, "list", "", "secrets")[0]  # cached on demand, reads gated per user
    assert not policy.authorize(me, groups, "list", "coordination.k8s.io", "leases")[0]
    assert not policy.authorize(me, groups, "create", "", "pods", "ns-1")[0]


def test_tokens_stay_out_of_reprs(policy: Policy) -> None:
    assert "alice-token" not in repr(policy.users)


VALID_RULE = "{apiGroups: [''], resources: [pods], verbs: [get]}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the policy is empty"),
        ("users: [\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping, not a list"),
        ("users: []\nroles: []\n", "unknown field 'roles' (expected one of: users, bindings)"),
        ("users: {alice: x}\n", "users: must be a list, not a mapping"),
        ("users: [{token: t}]\n", "users[0].name: is required"),
        ("users: [{name: ''}]\n", "users[0].name: must not be empty"),
        ("users: [{name: a, token: 12345}]\n", "users[0].token: must be a string, not a number"),
        ("users: [{name: a, token: 'x y'}]\n", "users[0].token: must not contain spaces"),
        ("users: [{name: a, groups: g}]\n", "users[0].groups: must be a list of strings, not a string"),
        ("users: [{name: a, extra: {k: v}}]\n", "users[0].extra.k: must be a list of strings"),
        ("users: [{name: a, tokn: t}]\n", "users[0]: unknown field 'tokn'"),
        ("users: [{name: a}, {name: a}]\n", "users[1].name: 'a' is already users[0]"),
        ("bindings: [{users: [a]}]\n", "bindings[0].rules: must be a non-empty list of rules"),
        (f"bindings: [{{rules: [{VALID_RULE}]}}]\n", "bindings[0]: binds nobody"),
        ("bindings: [{users: [a], rules: [{apiGroups: [''], resources: [pods]}]}]\n", "rules[0].verbs: is required"),
        ("bindings: [{users: [a], rules: [{apiGroups: [''], resources: [pods], verbs: []}]}]\n", "must not be empty"),
        ("bindings: [{users: [a], rules: [{resources: [pods], verbs: [get]}]}]\n", "rules[0].apiGroups: is required"),
        ("bindings: [{users: [a], rules: [{apiGroups: [''], verbs: [get]}]}]\n", "needs 'resources'"),
        (
            "bindings: [{users: [a], rules: [{apiGroups: [''], resources: [pods], verbs: [get], resourcenames: [x]}]}]",
            "bindings[0].rules[0]: unknown field 'resourcenames'",
        ),
        (
            "bindings: [{users: [a], rules: [{apiGroups: [''], resources: [pods], verbs: [get], namespaces: []}]}]\n",
            "bindings[0].rules[0].namespaces: must not be empty",
        ),
        (
            "bindings: [{users: [a], rules: [{nonResourceURLs: ['/x'], verbs: [get], namespaces: [n]}]}]\n",
            "a rule with nonResourceURLs cannot have namespaces",
        ),
        (
            "bindings: [{users: [a], rules: [{nonResourceURLs: [version], verbs: [get]}]}]\n",
            "nonResourceURLs[0]: 'version' must start with '/'",
        ),
        (
            "bindings: [{users: [a], rules: [{apiGroups: [''], resources: [''], verbs: [get]}]}]\n",
            "rules[0].resources[0]: must not be empty",
        ),
    ],
)
def test_invalid_policies_are_refused_with_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        Policy.from_yaml(text, "p.yaml")
    assert str(err.value).startswith("p.yaml: ")
    assert message in str(err.value)


def test_a_duplicate_token_is_refused_without_showing_it() -> None:
    with pytest.raises(PolicyError) as err:
        Policy.from_yaml("users: [{name: a, token: sekrit}, {name: b, token: sekrit}]\n", "p.yaml")
    assert str(err.value) == "p.yaml: users[1].token: the same token as users[0]"


def test_a_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_a_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"users: [{{name: a, token: t}}]\nbindings: [{{users: [a], rules: [{VALID_RULE}]}}]\n")
    policy = load_policy(path)
    assert policy.authorize("a", [], "get", "", "pods", "ns", "p") == (
        True,
        'policy: allowed by binding "binding-0" rule 0 to User "a"',
    )


# ------------------------------------------------------------------ the RBAC matrix, through the endpoints

USERS = ["alice-token", "bob-token", "carol-token", "dave-token", "admin-token", None]  # None: anonymous
VERBS = ["list", "get", "watch"]
SCOPES = ["", "ns-1", "ns-2"]  # "" is the cluster scope
TARGETS = ["pods", "configmaps", "cm-1"]  # cm-1: the configmap named cm-1 (a get, or a list/watch by fieldSelector)


def expected(token: str | None, scope: str, target: str) -> bool:
    """What the example policy grants, written from its description rather than its rules."""
    if token in ("alice-token", "admin-token"):
        return True  # alice reads pods and configmaps everywhere; admin is system:masters
    if token == "bob-token":
        return scope == "ns-1"
    if token == "carol-token":
        return scope == "ns-1" and target == "cm-1"
    return False  # dave and anonymous: no rights


def post(policy: Policy, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    code, data = handle_review(policy, path, orjson.dumps(body))
    answer: dict[str, Any] = orjson.loads(data)
    return code, answer


def subject(policy: Policy, token: str | None) -> dict[str, Any]:
    """spec.user/groups as a TokenReview of ``token`` gives them (anonymous without one)."""
    if token is None:
        return {"user": "system:anonymous", "groups": ["system:unauthenticated"]}
    code, review = post(policy, TOKEN_REVIEW_PATH, {"kind": "TokenReview", "spec": {"token": token}})
    assert code == 201 and review["status"]["authenticated"] is True
    user = review["status"]["user"]
    return {"user": user["username"], "uid": user.get("uid", ""), "groups": user["groups"]}


@pytest.mark.parametrize(("token", "verb", "scope", "target"), list(itertools.product(USERS, VERBS, SCOPES, TARGETS)))
def test_rbac_matrix(policy: Policy, token: str | None, verb: str, scope: str, target: str) -> None:
    attrs = {"verb": verb, "version": "v1", "resource": "configmaps" if target == "cm-1" else target}
    if scope:
        attrs["namespace"] = scope
    if target == "cm-1":
        attrs["name"] = "cm-1"
    elif verb == "get":
        attrs["name"] = "p1" if target == "pods" else "cm-2"
    spec = {**subject(policy, token), "resourceAttributes": attrs}
    code, answer = post(policy, ACCESS_REVIEW_PATH, {"apiVersion": "authorization.k8s.io/v1", "spec": spec})
    assert code == 201
    assert answer["status"]["allowed"] is expected(token, scope, target), answer


def test_the_matrix_is_not_trivial() -> None:
    cases = list(itertools.product(USERS, SCOPES, TARGETS))
    allowed = sum(expected(t, s, g) for t, s, g in cases)
    assert 0 < allowed < len(cases)


# ------------------------------------------------------------------ RBAC semantics beyond the matrix


def rules(*rule: str) -> Policy:
    return Policy.from_yaml(f"bindings: [{{users: [u], rules: [{', '.join(rule)}]}}]\n")


def allowed(policy: Policy, verb: str, resource: str, namespace: str = "", name: str = "", **kw: Any) -> bool:
    ok, _ = policy.authorize("u", kw.pop("groups", ()), verb, kw.pop("group", ""), resource, namespace, name, **kw)
    return ok


def test_resource_names_never_grant_an_unnamed_request() -> None:
    p = rules("{apiGroups: [''], resources: [configmaps], verbs: ['*'], resourceNames: [cm-1]}")
    assert allowed(p, "get", "configmaps", "ns", "cm-1")
    assert allowed(p, "watch", "configmaps", "ns", "cm-1")
    assert not allowed(p, "get", "configmaps", "ns", "cm-2")
    for verb in ("list", "watch", "create", "deletecollection"):
        assert not allowed(p, verb, "configmaps", "ns")


def test_groups_verbs_and_subresources() -> None:
    p = rules(
        "{apiGroups: [apps], resources: [deployments, deployments/scale], verbs: [get]}",
        "{apiGroups: ['*'], resources: ['*/status'], verbs: [get]}",
        "{apiGroups: [''], resources: [pods/log], verbs: [get]}",
    )
    assert allowed(p, "get", "deployments", group="apps")
    assert not allowed(p, "get", "deployments", group="")
    assert not allowed(p, "list", "deployments", group="apps")
    assert allowed(p, "get", "deployments", group="apps", subresource="scale")
    assert allowed(p, "get", "pods", subresource="status")
    assert allowed(p, "get", "pods", subresource="log")
    assert not allowed(p, "get", "pods")
    assert not allowed(p, "get", "pods", subresource="exec")


def test_namespaced_rules_never_match_the_cluster_scope() -> None:
    p = rules("{apiGroups: [''], resources: [pods, nodes], verbs: [list], namespaces: [ns-1, ns-2]}")
    assert allowed(p, "list", "pods", "ns-2")
    assert not allowed(p, "list", "pods", "ns-3")
    assert not allowed(p, "list", "pods")
    assert not allowed(p, "list", "nodes")


def test_bindings_to_groups() -> None:
    p = Policy.from_yaml(f"bindings: [{{name: readers, groups: [readers], rules: [{VALID_RULE}]}}]\n")
    assert p.authorize("x", ["readers"], "get", "", "pods") == (
        True,
        'policy: allowed by binding "readers" rule 0 to Group "readers"',
    )
    assert p.authorize("readers", [], "get", "", "pods") == (False, "")


def test_non_resource_urls(policy: Policy) -> None:
    anonymous = ["system:unauthenticated"]
    assert policy.authorize_non_resource("system:anonymous", anonymous, "get", "/apis/apps/v1")[0]
    assert policy.authorize_non_resource("system:anonymous", anonymous, "get", "/version")[0]
    assert not policy.authorize_non_resource("system:anonymous", anonymous, "get", "/metrics")[0]
    assert not policy.authorize_non_resource("system:anonymous", anonymous, "post", "/apis")[0]
    assert policy.authorize_non_resource("admin", ["system:masters"], "get", "/metrics")[0]


# ------------------------------------------------------------------ endpoint shapes


def test_token_review_of_a_valid_token(policy: Policy) -> None:
    code, answer = post(
        policy,
        TOKEN_REVIEW_PATH,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "admin-token"}},
    )
    assert code == 201
    assert answer == {
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {"token": "admin-token"},
        "status": {
            "authenticated": True,
            "user": {"username": "admin", "uid": "uid-admin", "groups": ["system:masters", "system:authenticated"]},
            "audiences": ["https://kubernetes.default.svc.cluster.local"],
        },
    }


def test_token_review_echoes_requested_audiences_and_extra() -> None:
    p = Policy.from_yaml("users: [{name: a, token: t, extra: {scopes: [x, y]}}]\n")
    _, answer = post(p, TOKEN_REVIEW_PATH, {"spec": {"token": "t", "audiences": ["watchcache"]}})
    assert answer["status"] == {
        "authenticated": True,
        "user": {"username": "a", "groups": ["system:authenticated"], "extra": {"scopes": ["x", "y"]}},
        "audiences": ["watchcache"],
    }


def test_token_review_of_an_unknown_token(policy: Policy) -> None:
    code, answer = post(policy, TOKEN_REVIEW_PATH, {"kind": "TokenReview", "spec": {"token": "nope"}})
    assert code == 201
    assert answer["status"] == {"user": {}, "error": "invalid bearer token"}


def test_subject_access_review_allowed_and_denied(policy: Policy) -> None:
    spec = {
        "resourceAttributes": {"namespace": "ns-1", "verb": "list", "version": "v1", "resource": "pods"},
        "user": "bob",
        "groups": ["system:authenticated"],
        "uid": "uid-bob",
    }
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    code, answer = post(policy, ACCESS_REVIEW_PATH, body)
    assert code == 201
    assert answer == {
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"allowed": True, "reason": 'policy: allowed by binding "bob-ns-1-reader" rule 0 to User "bob"'},
    }
    spec["resourceAttributes"]["namespace"] = "ns-2"  # type: ignore[index]
    code, answer = post(policy, ACCESS_REVIEW_PATH, body)
    assert (code, answer["status"]) == (201, {"allowed": False})


def test_subject_access_review_of_a_non_resource_path(policy: Policy) -> None:
    spec = {
        "nonResourceAttributes": {"path": "/version", "verb": "get"},
        "user": "dave",
        "groups": ["system:authenticated"],
    }
    code, answer = post(policy, ACCESS_REVIEW_PATH, {"spec": spec})
    assert code == 201 and answer["status"]["allowed"] is True


@pytest.mark.parametrize(
    ("path", "body", "code", "message"),
    [
        (TOKEN_REVIEW_PATH, {"spec": {}}, 400, "token is required for TokenReview in authentication.k8s.io"),
        (TOKEN_REVIEW_PATH, {"spec": {"token": 5}}, 400, "token is required"),
        (TOKEN_REVIEW_PATH, [1], 400, "must be of type TokenReview"),
        (TOKEN_REVIEW_PATH, {"kind": "SubjectAccessReview", "spec": {"token": "t"}}, 400, "is not TokenReview"),
        (
            ACCESS_REVIEW_PATH,
            {"spec": {"resourceAttributes": {"verb": "get"}}},
            422,
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": '
            "at least one of user or group must be specified",
        ),
        (
            ACCESS_REVIEW_PATH,
            {"spec": {"user": "a"}},
            422,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ),
        (
            ACCESS_REVIEW_PATH,
            {"spec": {"user": "a", "resourceAttributes": {}, "nonResourceAttributes": {}}},
            422,
            "cannot be specified in combination with resourceAttributes",
        ),
        (ACCESS_REVIEW_PATH, {"spec": {"user": "a", "resourceAttributes": {"verb": 1}}}, 400, "verb must be a string"),
        ("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {}, 404, "the server could not find"),
    ],
)
def test_malformed_reviews_get_kube_status_errors(
    policy: Policy, path: str, body: Any, code: int, message: str
) -> None:
    got, answer = post(policy, path, body)
    assert got == code
    assert answer["kind"] == "Status" and answer["code"] == code
    assert message in answer["message"]


def test_a_body_that_is_not_json(policy: Policy) -> None:
    code, data = handle_review(policy, TOKEN_REVIEW_PATH, b"{nope")
    assert code == 400
    assert orjson.loads(data)["reason"] == "BadRequest"


def test_the_local_client_answers_like_the_endpoint(policy: Policy) -> None:
    client = LocalReviewClient(policy)
    answer = asyncio.run(client.post(TOKEN_REVIEW_PATH, {"spec": {"token": "alice-token"}}))
    assert answer["status"]["user"]["username"] == "alice"
    with pytest.raises(ReviewError, match="HTTP 400"):
        asyncio.run(client.post(TOKEN_REVIEW_PATH, {"spec": {}}))
    assert client.requests == 2

"""SubjectAccessReviewer and the attributes it authorizes: kube's RequestInfo rules, exact 403s."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from tests.support.authfakes import Clock, FakeReviews, info_of, request
from watchcache.apierrors import StatusError
from watchcache.auth.authn import UserInfo
from watchcache.auth.authz import (
    Decision,
    NonResourceAttributes,
    ResourceAttributes,
    SubjectAccessReviewer,
    forbidden,
    name_from_field_selector,
)
from watchcache.auth.review import ACCESS_REVIEW_PATH, ReviewError
from watchcache.http.routing import parse_request_info

CM1 = (("metadata.name", "In", ("cm-1",)),)
ALICE = UserInfo("alice", "u-1", ("devs", "system:authenticated"), {"scopes": ("a",)})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def attrs_of(target: str) -> ResourceAttributes:
    req = request(target)
    return ResourceAttributes.from_request_info(info_of(req), req.query_value("fieldSelector"))


# ------------------------------------------------------------------ attributes


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/api/v1/namespaces/ns-1/pods", ResourceAttributes("list", "", "v1", "pods", "", "ns-1", "")),
        ("/api/v1/pods", ResourceAttributes("list", "", "v1", "pods")),
        ("/api/v1/pods?watch=true", ResourceAttributes("watch", "", "v1", "pods")),
        ("/api/v1/namespaces/ns-1/pods/p1", ResourceAttributes("get", "", "v1", "pods", "", "ns-1", "p1")),
        (
            "/apis/apps/v1/namespaces/ns-1/deployments/web",
            ResourceAttributes("get", "apps", "v1", "deployments", "", "ns-1", "web"),
        ),
        ("/api/v1/nodes/node-1", ResourceAttributes("get", "", "v1", "nodes", "", "", "node-1")),
        # the Namespace object is in its own namespace, as in kube's RequestInfo
        ("/api/v1/namespaces/ns-1", ResourceAttributes("get", "", "v1", "namespaces", "", "ns-1", "ns-1")),
        ("/api/v1/namespaces", ResourceAttributes("list", "", "v1", "namespaces")),
        # a list/watch pinned to one name is authorized with that name
        (
            "/api/v1/namespaces/ns-1/configmaps?fieldSelector=metadata.name%3Dcm-1",
            ResourceAttributes("list", "", "v1", "configmaps", "", "ns-1", "cm-1", CM1),
        ),
        (
            "/api/v1/namespaces/ns-1/configmaps?watch=1&fieldSelector=metadata.name%3D%3Dcm-1",
            ResourceAttributes("watch", "", "v1", "configmaps", "", "ns-1", "cm-1", CM1),
        ),
        (
            "/api/v1/namespaces?fieldSelector=metadata.name%3Dns-1",
            ResourceAttributes("list", "", "v1", "namespaces", "", "", "ns-1", (("metadata.name", "In", ("ns-1",)),)),
        ),
        # ...but not through the legacy /watch/ prefix (kube sets the verb before reading the selector),
        # which still carries the selector itself
        (
            "/api/v1/watch/namespaces/ns-1/configmaps?fieldSelector=metadata.name%3Dcm-1",
            ResourceAttributes("watch", "", "v1", "configmaps", "", "ns-1", "", CM1),
        ),
        # and a GET of a named object keeps its own name whatever the selector says
        (
            "/api/v1/namespaces/ns-1/configmaps/cm-2?fieldSelector=metadata.name%3Dcm-1",
            ResourceAttributes("get", "", "v1", "configmaps", "", "ns-1", "cm-2"),
        ),
    ],
)
def test_attributes_follow_kubes_request_info(target: str, expected: ResourceAttributes) -> None:
    assert attrs_of(target) == expected


@pytest.mark.parametrize(
    ("selector", "name"),
    [
        ("metadata.name=cm-1", "cm-1"),
        ("metadata.name==cm-1", "cm-1"),
        ("metadata.namespace=ns-1,metadata.name=cm-1", "cm-1"),
        ("spec.nodeName=n1,metadata.name=p\\,1", "p,1"),
        ("metadata.name!=cm-1", ""),
        ("metadata.namespace=ns-1", ""),
        ("metadata.name", ""),  # does not parse: the whole collection
        ("metadata.name=a,b", ""),  # does not parse
        ("metadata.name=a/b", ""),  # not a valid path segment name
        ("metadata.name=a%2Fb", ""),
        ("metadata.name=..", ""),
        ("metadata.name=", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_name_from_field_selector(selector: str | None, name: str) -> None:
    assert name_from_field_selector(selector) == name


@pytest.mark.parametrize(
    ("target", "fields", "labels"),
    [
        # a kubelet's pod watch: kube's Node authorizer allows it only with the node's own name
        ("/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dnode-1", (("spec.nodeName", "In", ("node-1",)),), ()),
        # the scheduler's: != is NotIn
        (
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed",
            (("status.phase", "NotIn", ("Failed",)), ("status.phase", "NotIn", ("Succeeded",))),
            (),
        ),
        (
            "/api/v1/namespaces/ns-1/configmaps?labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29%2C%21canary%2Cx%2Cn%3E3",
            (),
            (
                ("app", "In", ("web",)),
                ("canary", "DoesNotExist", ()),
                ("tier", "In", ("a", "b")),
                ("x", "Exists", ()),
            ),  # "n>3" cannot be a requirement: left out, which only asks for more
        ),
        ("/api/v1/pods?labelSelector=a%21%3Db%2Cc+notin+%28d%29", (), (("a", "NotIn", ("b",)), ("c", "NotIn", ("d",)))),
        # selectors that do not parse are not requirements (the request gets its 400 after)
        ("/api/v1/pods?fieldSelector=spec.nodeName&labelSelector=a+in+b", (), ()),
        # a GET of one object carries none (kube reads selectors for list and watch only)
        ("/api/v1/namespaces/ns-1/pods/p1?fieldSelector=spec.nodeName%3Dn&labelSelector=a", (), ()),
    ],
)
def test_list_and_watch_carry_their_selectors_as_requirements(target: str, fields: tuple, labels: tuple) -> None:
    req = request(target)
    attrs = ResourceAttributes.from_request_info(
        info_of(req), req.query_value("fieldSelector"), req.query_value("labelSelector")
    )
    assert (attrs.field_selector, attrs.label_selector) == (fields, labels)


def test_selectors_are_written_as_subject_access_review_requirements() -> None:
    attrs = ResourceAttributes(
        "watch", "", "v1", "pods", field_selector=(("spec.nodeName", "In", ("node-1",)),),
        label_selector=(("app", "In", ("a", "b")), ("x", "Exists", ())),
    )  # fmt: skip
    assert attrs.to_spec() == {
        "verb": "watch",
        "version": "v1",
        "resource": "pods",
        "fieldSelector": {"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["node-1"]}]},
        "labelSelector": {
            "requirements": [{"key": "app", "operator": "In", "values": ["a", "b"]}, {"key": "x", "operator": "Exists"}]
        },
    }


def test_non_resource_requests_have_no_resource_attributes() -> None:
    with pytest.raises(ValueError):
        ResourceAttributes.from_request_info(parse_request_info("GET", "/version", False))


def test_spec_omits_empty_fields() -> None:
    assert ResourceAttributes("list", "", "v1", "pods").to_spec() == {
        "verb": "list",
        "version": "v1",
        "resource": "pods",
    }
    full = ResourceAttributes("get", "apps", "v1", "deployments", "scale", "ns-1", "web").to_spec()
    assert full == {
        "namespace": "ns-1",
        "verb": "get",
        "group": "apps",
        "version": "v1",
        "resource": "deployments",
        "subresource": "scale",
        "name": "web",
    }


# ------------------------------------------------------------------ kube's exact 403


def status_of(err: StatusError) -> dict[str, Any]:
    status: dict[str, Any] = orjson.loads(err.body())
    return status


def test_forbidden_list_in_a_namespace() -> None:
    err = forbidden(UserInfo("alice"), ResourceAttributes("list", "", "v1", "pods", namespace="ns-1"))
    assert status_of(err) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "ns-1"'
        ),
        "reason": "Forbidden",
        "details": {"kind": "pods"},
        "code": 403,
    }


def test_forbidden_at_the_cluster_scope() -> None:
    err = forbidden(UserInfo("alice"), ResourceAttributes("watch", "", "v1", "pods"))
    assert err.message == (
        'pods is forbidden: User "alice" cannot watch resource "pods" in API group "" at the cluster scope'
    )


def test_forbidden_with_a_name() -> None:
    err = forbidden(UserInfo("alice"), ResourceAttributes("get", "", "v1", "pods", namespace="ns-1", name="p1"))
    assert err.message == (
        'pods "p1" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "ns-1"'
    )
    assert err.details == {"name": "p1", "kind": "pods"}


def test_forbidden_in_a_named_group_with_a_subresource_and_a_reason() -> None:
    attrs = ResourceAttributes("get", "apps", "v1", "deployments", "scale", "ns-1", "web")
    err = forbidden(UserInfo("system:serviceaccount:ns-1:default"), attrs, "no RBAC policy matched")
    assert err.message == (
        'deployments.apps "web" is forbidden: User "system:serviceaccount:ns-1:default" cannot get resource '
        '"deployments/scale" in API group "apps" in the namespace "ns-1": no RBAC policy matched'
    )
    assert err.details == {"name": "web", "group": "apps", "kind": "deployments"}
    assert (err.code, err.reason) == (403, "Forbidden")


def test_forbidden_anonymous_list_by_name_from_a_field_selector() -> None:
    attrs = attrs_of("/api/v1/namespaces/ns-1/configmaps?fieldSelector=metadata.name%3Dcm-2")
    err = forbidden(UserInfo("system:anonymous"), attrs)
    assert err.message == (
        'configmaps "cm-2" is forbidden: User "system:anonymous" cannot list resource "configmaps" in API group "" '
        'in the namespace "ns-1"'
    )


def test_forbidden_path_is_kubes_non_resource_403() -> None:
    err = forbidden(UserInfo("nobody"), NonResourceAttributes("get", "/metrics"))
    # kube-apiserver v1.36, `GET /metrics` with a token that has no grant on it.
    assert status_of(err) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'forbidden: User "nobody" cannot get path "/metrics"',
        "reason": "Forbidden",
        "details": {},
        "code": 403,
    }
    err = forbidden(UserInfo("a<b>"), NonResourceAttributes("head", "/debug/x&y"), "RBAC: no rule")
    assert err.message == 'forbidden: User "a&lt;b&gt;" cannot head path "/debug/x&amp;y": RBAC: no rule'


# ------------------------------------------------------------------ the reviewer


def sar_answer(allowed: bool, reason: str = "", **status: Any) -> Any:
    def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
        st: dict[str, Any] = {"allowed": allowed, **status}
        if reason:
            st["reason"] = reason
        return {**body, "status": st}

    return answer


LIST_PODS = ResourceAttributes("list", "", "v1", "pods", namespace="ns-1")


def test_the_review_carries_the_user_and_the_attributes() -> None:
    fake = FakeReviews(sar_answer(True, "RBAC: allowed"))
    decision = run(SubjectAccessReviewer(fake).authorize(ALICE, LIST_PODS))
    assert decision == Decision(True, "RBAC: allowed")
    assert fake.calls == [
        (
            ACCESS_REVIEW_PATH,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "resourceAttributes": {"namespace": "ns-1", "verb": "list", "version": "v1", "resource": "pods"},
                    "user": "alice",
                    "groups": ["devs", "system:authenticated"],
                    "extra": {"scopes": ["a"]},
                    "uid": "u-1",
                },
            },
        )
    ]


def test_a_path_is_reviewed_with_non_resource_attributes() -> None:
    fake = FakeReviews(sar_answer(False))
    attrs = NonResourceAttributes("get", "/metrics")
    assert run(SubjectAccessReviewer(fake).authorize(ALICE, attrs)) == Decision(False, "")
    assert fake.calls[0][1]["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert "resourceAttributes" not in fake.calls[0][1]["spec"]


def test_the_anonymous_review_has_no_uid_or_extra() -> None:
    fake = FakeReviews(sar_answer(False))
    anonymous = UserInfo("system:anonymous", "", ("system:unauthenticated",))
    assert run(SubjectAccessReviewer(fake).authorize(anonymous, LIST_PODS)) == Decision(False, "")
    assert fake.calls[0][1]["spec"] == {
        "resourceAttributes": {"namespace": "ns-1", "verb": "list", "version": "v1", "resource": "pods"},
        "user": "system:anonymous",
        "groups": ["system:unauthenticated"],
    }


@pytest.mark.parametrize(("allowed", "ttl"), [(True, 10.0), (False, 2.0)])
def test_decisions_are_cached_for_their_ttl(allowed: bool, ttl: float) -> None:
    clock = Clock()
    fake = FakeReviews(sar_answer(allowed))
    reviewer = SubjectAccessReviewer(fake, clock=clock)

    async def go() -> None:
        await reviewer.authorize(ALICE, LIST_PODS)
        clock.now += ttl - 0.01
        assert (await reviewer.authorize(ALICE, LIST_PODS)).allowed is allowed
        assert len(fake.calls) == 1
        clock.now += 0.01
        await reviewer.authorize(ALICE, LIST_PODS)
        assert len(fake.calls) == 2

    run(go())


def test_the_cache_key_is_the_whole_question() -> None:
    fake = FakeReviews(sar_answer(True))
    reviewer = SubjectAccessReviewer(fake)
    questions = [
        (ALICE, LIST_PODS),
        (ALICE, ResourceAttributes("list", "", "v1", "pods", namespace="ns-2")),
        (ALICE, ResourceAttributes("watch", "", "v1", "pods", namespace="ns-1")),
        (ALICE, ResourceAttributes("list", "", "v1", "pods", namespace="ns-1", name="p1")),
        (UserInfo("alice", "u-1", ("devs",), {"scopes": ("a",)}), LIST_PODS),  # other groups
        (UserInfo("alice", "u-2", ALICE.groups, ALICE.extra), LIST_PODS),  # other uid
        (UserInfo("alice", "u-1", ALICE.groups, {"scopes": ("b",)}), LIST_PODS),  # other extra
        (UserInfo("bob", "u-1", ALICE.groups, ALICE.extra), LIST_PODS),
    ]

    async def go() -> None:
        for user, attrs in questions * 2:
            await reviewer.authorize(user, attrs)

    run(go())
    assert len(fake.calls) == len(questions)
    assert reviewer.cache.hits == len(questions)


def test_concurrent_identical_questions_share_one_review() -> None:
    fake = FakeReviews(sar_answer(True))
    reviewer = SubjectAccessReviewer(fake)

    async def go() -> list[Decision]:
        fake.hold()
        tasks = [asyncio.ensure_future(reviewer.authorize(ALICE, LIST_PODS)) for _ in range(10)]
        await asyncio.sleep(0)
        fake.release()
        return list(await asyncio.gather(*tasks))

    assert run(go()) == [Decision(True)] * 10
    assert len(fake.calls) == 1
    assert reviewer.cache.joined == 9


@pytest.mark.parametrize(
    "answer",
    [
        lambda path, body: ReviewError("POST: HTTP 503"),
        lambda path, body: {"kind": "SubjectAccessReview"},
        lambda path, body: {"status": {"allowed": True, "denied": True}},
        lambda path, body: {"status": {"allowed": False, "reason": 7}},
    ],
)
def test_no_decision_fails_closed_with_a_retryable_500_not_cached(answer: Any) -> None:
    fake = FakeReviews(answer)
    reviewer = SubjectAccessReviewer(fake)
    for _ in range(2):
        with pytest.raises(StatusError) as err:
            run(reviewer.authorize(ALICE, LIST_PODS))
        assert (err.value.code, err.value.reason) == (500, "InternalError")
        assert err.value.retry_after == 1
    assert len(fake.calls) == 2
    assert reviewer.failures == 2


def test_an_explicit_deny_is_a_denial() -> None:
    fake = FakeReviews(sar_answer(False, "denied by policy", denied=True))
    assert run(SubjectAccessReviewer(fake).authorize(ALICE, LIST_PODS)) == Decision(False, "denied by policy")

"""The simulated cluster's review endpoints: ``TokenReview`` and ``SubjectAccessReview``.

``handle_review`` answers ``POST /apis/authentication.k8s.io/v1/tokenreviews`` and
``POST /apis/authorization.k8s.io/v1/subjectaccessreviews`` from a ``Policy`` as
kube-apiserver does: ``201 Created`` with the posted object echoed (``metadata``
normalised) plus its ``status``:

- TokenReview: ``{"authenticated": true, "user": {username, uid, groups, extra},
  "audiences": [...]}`` for a known token (groups gain ``system:authenticated``), else
  ``{"user": {}, "error": "invalid bearer token"}``. Policy tokens are valid for any
  audience: the requested ones are echoed (the default API audience if none).
- SubjectAccessReview: ``{"allowed": bool, "reason": "..."}`` (``reason`` omitted when
  empty, as kube's JSON), from the spec's user and groups only (the reviewer does not look
  the user up, exactly as kube).

Malformed requests get kube's Status errors (400, or 422 ``Invalid`` with its field
messages); every answer is a (status, body) pair, errors included.
``LocalReviewClient`` is a ``ReviewClient`` over the same function, so a gate can review
in-process (the embedded sim, tests).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from watchcache import apierrors
from watchcache.auth.authn import UserInfo
from watchcache.auth.review import ACCESS_REVIEW_PATH, TOKEN_REVIEW_PATH, ReviewError
from watchcache.sim.policy import Policy

__all__ = [
    "ACCESS_REVIEW_PATH",
    "REVIEW_PATHS",
    "SELF_SUBJECT_REVIEW_PATH",
    "TOKEN_REVIEW_PATH",
    "LocalReviewClient",
    "handle_review",
    "self_subject_review",
]

REVIEW_PATHS = frozenset({TOKEN_REVIEW_PATH, ACCESS_REVIEW_PATH})
SELF_SUBJECT_REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
DEFAULT_AUDIENCES = ("https://kubernetes.default.svc.cluster.local",)
_AUTHENTICATED = "system:authenticated"
_UNAUTHENTICATED = "system:unauthenticated"
_AUTHN = "authentication.k8s.io/v1"
_AUTHZ = "authorization.k8s.io/v1"


def _error(err: apierrors.StatusError) -> tuple[int, bytes]:
    return err.code, err.body()


def _created(api_version: str, kind: str, obj: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]) -> bytes:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    answer = {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {**metadata, "creationTimestamp": None},
        "spec": spec,
        "status": status,
    }
    return orjson.dumps(answer)


def _decode(body: bytes, api_version: str, kind: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(body) if body else None
    except orjson.JSONDecodeError as e:
        raise apierrors.bad_request(f"the body of the request is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise apierrors.bad_request(f"the object provided is unrecognized (must be of type {kind})")
    got_kind, got_version = obj.get("kind"), obj.get("apiVersion")
    if got_kind not in (None, "", kind) or got_version not in (None, "", api_version):
        raise apierrors.bad_request(
            f"the API version in the data ({got_version}) does not match the expected API version ({api_version}) "
            f"or the kind ({got_kind}) is not {kind}"
        )
    spec = obj.get("spec", {})
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise apierrors.bad_request(f"{kind}.spec must be an object")
    return obj


def _string_list(value: Any, field: str, kind: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise apierrors.bad_request(f"{kind}.{field} must be a list of strings")
    return value


def _token_review(policy: Policy, body: bytes) -> tuple[int, bytes]:
    obj = _decode(body, _AUTHN, "TokenReview")
    spec = obj.get("spec") or {}
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise apierrors.bad_request("token is required for TokenReview in authentication.k8s.io")
    audiences = _string_list(spec.get("audiences"), "spec.audiences", "TokenReview")
    user = policy.authenticate(token)
    status: dict[str, Any]
    if user is None:
        status = {"user": {}, "error": "invalid bearer token"}
    else:
        groups = list(user.groups)
        if _AUTHENTICATED not in groups and _UNAUTHENTICATED not in groups:
            groups.append(_AUTHENTICATED)
        info: dict[str, Any] = {"username": user.name}
        if user.uid:
            info["uid"] = user.uid
        info["groups"] = groups
        if user.extra:
            info["extra"] = {k: list(v) for k, v in user.extra.items()}
        status = {"authenticated": True, "user": info, "audiences": audiences or list(DEFAULT_AUDIENCES)}
    return 201, _created(_AUTHN, "TokenReview", obj, spec, status)


def _attr(attrs: dict[str, Any], key: str) -> str:
    value = attrs.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise apierrors.bad_request(f"SubjectAccessReview.spec.resourceAttributes.{key} must be a string")
    return value


def _access_review(policy: Policy, body: bytes) -> tuple[int, bytes]:
    obj = _decode(body, _AUTHZ, "SubjectAccessReview")
    spec = obj.get("spec") or {}
    user = spec.get("user") or ""
    if not isinstance(user, str):
        raise apierrors.bad_request("SubjectAccessReview.spec.user must be a string")
    groups = _string_list(spec.get("groups"), "spec.groups", "SubjectAccessReview")
    resource_attrs = spec.get("resourceAttributes")
    non_resource_attrs = spec.get("nonResourceAttributes")
    causes: list[tuple[str, str, str]] = []
    if resource_attrs is not None and non_resource_attrs is not None:
        causes.append(
            (
                "spec.nonResourceAttributes",
                "FieldValueInvalid",
                'Invalid value: "": cannot be specified in combination with resourceAttributes',
            )
        )
    elif resource_attrs is None and non_resource_attrs is None:
        causes.append(
            (
                "spec.resourceAttributes",
                "FieldValueInvalid",
                'Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
            )
        )
    if not user and not groups:
        causes.append(
            ("spec.user", "FieldValueInvalid", 'Invalid value: "": at least one of user or group must be specified')
        )
    if causes:
        raise apierrors.invalid("SubjectAccessReview", "authorization.k8s.io", "", causes)
    if resource_attrs is not None:
        if not isinstance(resource_attrs, dict):
            raise apierrors.bad_request("SubjectAccessReview.spec.resourceAttributes must be an object")
        allowed, reason = policy.authorize(
            user,
            groups,
            verb=_attr(resource_attrs, "verb"),
            group=_attr(resource_attrs, "group"),
            resource=_attr(resource_attrs, "resource"),
            namespace=_attr(resource_attrs, "namespace"),
            name=_attr(resource_attrs, "name"),
            subresource=_attr(resource_attrs, "subresource"),
        )
    else:
        if not isinstance(non_resource_attrs, dict):
            raise apierrors.bad_request("SubjectAccessReview.spec.nonResourceAttributes must be an object")
        allowed, reason = policy.authorize_non_resource(
            user, groups, _attr(non_resource_attrs, "verb"), _attr(non_resource_attrs, "path")
        )
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return 201, _created(_AUTHZ, "SubjectAccessReview", obj, spec, status)


def self_subject_review(user: UserInfo) -> bytes:
    """The answer to ``POST .../selfsubjectreviews`` (``kubectl auth whoami``): who the request was."""
    info: dict[str, Any] = {"username": user.username}
    if user.uid:
        info["uid"] = user.uid
    if user.groups:
        info["groups"] = list(user.groups)
    if user.extra:
        info["extra"] = {k: list(v) for k, v in user.extra.items()}
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return orjson.dumps(
        {
            "kind": "SelfSubjectReview",
            "apiVersion": _AUTHN,
            "metadata": {"creationTimestamp": created},
            "status": {"userInfo": info},
        }
    )


def handle_review(policy: Policy, path: str, body: bytes) -> tuple[int, bytes]:
    """Answer a POST of a TokenReview or SubjectAccessReview: (HTTP status, JSON body)."""
    try:
        if path == TOKEN_REVIEW_PATH:
            return _token_review(policy, body)
        if path == ACCESS_REVIEW_PATH:
            return _access_review(policy, body)
        raise apierrors.path_not_found()
    except apierrors.StatusError as e:
        return _error(e)


class LocalReviewClient:
    """A ``ReviewClient`` answered in-process by ``handle_review`` (no network, same bytes)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests = 0

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        code, data = handle_review(self.policy, path, orjson.dumps(body))
        if not 200 <= code < 300:
            raise ReviewError(f"POST {path}: HTTP {code}: {orjson.loads(data).get('message', '')}")
        answer: dict[str, Any] = orjson.loads(data)
        return answer

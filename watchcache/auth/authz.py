"""May this user do this: ``SubjectAccessReview`` on the upstream, cached, single flight.

The attributes are kube-apiserver's (``RequestInfo`` → ``authorizer.Attributes``): verb,
API group and version, resource, subresource, namespace, name. Two details follow
kube's ``RequestInfoFactory`` because RBAC ``resourceNames`` rules depend on them:

- a single-object GET (or a watch of one named object) carries the object's name;
- a LIST or WATCH of a collection whose ``fieldSelector`` pins ``metadata.name=X`` is
  authorized with name X (``name_from_field_selector``), so a user allowed to get/list/watch
  only ``cm-1`` can run an informer on it. The legacy ``/watch/`` path prefix does not get
  this (kube sets the verb before looking at the selector there).
- the Namespace object itself (``/api/v1/namespaces/NAME``) is in namespace NAME.
- a LIST or WATCH carries its ``fieldSelector`` and ``labelSelector`` as requirements
  (KEP-4601, on by default since v1.32): kube's Node authorizer lets a node list and watch
  pods only with ``spec.nodeName=<itself>``, so a kubelet's pod watch is refused without them.
  They are this proxy's own parse, the one it filters by: what is authorized is what is served.
  A term a requirement cannot say (``gt``, ``lt``) is left out, which only asks for more.

A denial is kube's 403 (``forbidden``) with its exact message; a review that gets no
answer fails closed with a 500 ``InternalError`` carrying ``Retry-After: 1`` (kube's
authorization filter answers 500 when its webhook errs; client-go retries a 5xx that
has a Retry-After). Failures are not cached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from watchcache.apierrors import StatusError
from watchcache.auth.authn import UserInfo
from watchcache.auth.cache import ReviewCache
from watchcache.auth.review import ACCESS_REVIEW_PATH, ReviewClient, ReviewError
from watchcache.quoting import go_quote
from watchcache.selectors.errors import SelectorError
from watchcache.selectors.fields import parse_field_selector
from watchcache.selectors.labels import Operator, parse_label_selector

if TYPE_CHECKING:
    from watchcache.http.routing import RequestInfo

log = logging.getLogger("watchcache.auth")


class _AnyField:
    """Every field is "supported": kube's RequestInfo parses the selector without a resource's field set."""

    def __contains__(self, item: object) -> bool:
        return True


_ANY_FIELD: Any = _AnyField()


def name_from_field_selector(field_selector: str | None) -> str:
    """The name a LIST/WATCH is authorized with: X when ``fieldSelector`` requires ``metadata.name=X``
    (``=`` or ``==``), "" otherwise or when the selector does not parse (kube then authorizes the
    whole collection) or X is not a valid path segment name."""
    if not field_selector:
        return ""
    try:
        selector = parse_field_selector(field_selector, _ANY_FIELD)
    except SelectorError:
        return ""
    name = selector.exact_value("metadata.name") or ""
    if name in (".", "..") or "/" in name or "%" in name:
        return ""
    return name


# A selector's requirements as SubjectAccessReview writes them: (key, operator, values).
Requirements = tuple[tuple[str, str, tuple[str, ...]], ...]

_FIELD_OPERATORS = {Operator.EQUALS: "In", Operator.NOT_EQUALS: "NotIn"}
_LABEL_OPERATORS = {
    Operator.IN: "In",
    Operator.EQUALS: "In",
    Operator.DOUBLE_EQUALS: "In",
    Operator.NOT_IN: "NotIn",
    Operator.NOT_EQUALS: "NotIn",
    Operator.EXISTS: "Exists",
    Operator.DOES_NOT_EXIST: "DoesNotExist",
}


def field_requirements(field_selector: str | None) -> Requirements:
    """``fieldSelector`` as requirements; none when it is empty or does not parse (the request is
    then answered 400 before any cached byte, and authorized as unlimited, as kube does)."""
    if not field_selector:
        return ()
    try:
        selector = parse_field_selector(field_selector, _ANY_FIELD)
    except SelectorError:
        return ()
    return tuple((r.field, _FIELD_OPERATORS[r.operator], (r.value,)) for r in selector.requirements)


def label_requirements(label_selector: str | None) -> Requirements:
    """``labelSelector`` as requirements (``gt``/``lt`` terms left out: only a narrower request is lost)."""
    if not label_selector:
        return ()
    try:
        selector = parse_label_selector(label_selector)
    except SelectorError:
        return ()
    return tuple(
        (r.key, _LABEL_OPERATORS[r.operator], r.values) for r in selector.requirements if r.operator in _LABEL_OPERATORS
    )


def _requirements_spec(requirements: Requirements) -> dict[str, Any]:
    out = []
    for key, operator, values in requirements:
        entry: dict[str, Any] = {"key": key, "operator": operator}
        if values:
            entry["values"] = list(values)
        out.append(entry)
    return {"requirements": out}


@dataclass(frozen=True)
class ResourceAttributes:
    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    field_selector: Requirements = ()
    label_selector: Requirements = ()

    @classmethod
    def from_request_info(
        cls, info: RequestInfo, field_selector: str | None = None, label_selector: str | None = None
    ) -> ResourceAttributes:
        """The attributes kube-apiserver would authorize ``info`` with; ``field_selector`` and
        ``label_selector`` are the request's query parameters (used for list/watch only)."""
        if not info.is_resource_request:
            raise ValueError(f"not a resource request: {info.path}")
        name = info.name
        selects = info.verb in ("list", "watch")
        if not name and selects and not info.watch_prefix:
            name = name_from_field_selector(field_selector)
        namespace = info.namespace
        if not namespace and info.group == "" and info.resource == "namespaces" and info.name:
            namespace = info.name
        return cls(
            verb=info.verb,
            group=info.group,
            version=info.version,
            resource=info.resource,
            subresource=info.subresource,
            namespace=namespace,
            name=name,
            field_selector=field_requirements(field_selector) if selects else (),
            label_selector=label_requirements(label_selector) if selects else (),
        )

    def to_spec(self) -> dict[str, Any]:
        """``spec.resourceAttributes`` of a SubjectAccessReview (empty fields omitted, as kube's JSON)."""
        fields: dict[str, Any] = {
            "namespace": self.namespace,
            "verb": self.verb,
            "group": self.group,
            "version": self.version,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
            "fieldSelector": _requirements_spec(self.field_selector) if self.field_selector else None,
            "labelSelector": _requirements_spec(self.label_selector) if self.label_selector else None,
        }
        return {k: v for k, v in fields.items() if v}


@dataclass(frozen=True)
class NonResourceAttributes:
    """A request for a path that is not an API resource (``/metrics``, ``/debug/...``): kube authorizes
    the lower-cased HTTP method as the verb and the path without its query."""

    verb: str
    path: str

    def to_spec(self) -> dict[str, str]:
        """``spec.nonResourceAttributes`` of a SubjectAccessReview."""
        return {"path": self.path, "verb": self.verb}


Attributes = ResourceAttributes | NonResourceAttributes


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


# kube's responsewriters sanitizer: no error message may look like HTML.
_SANITIZE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def forbidden(user: UserInfo, attrs: Attributes, reason: str = "") -> StatusError:
    """kube-apiserver's 403 for a denied request (``responsewriters.ForbiddenStatusError``)."""
    if isinstance(attrs, NonResourceAttributes):
        message = f"User {go_quote(user.username)} cannot {attrs.verb} path {go_quote(attrs.path)}".translate(_SANITIZE)
        if reason:
            message = f"{message}: {reason}"
        return StatusError(403, "Forbidden", f"forbidden: {message}", details={})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f"in the namespace {go_quote(attrs.namespace)}" if attrs.namespace else "at the cluster scope"
    message = (
        f"User {go_quote(user.username)} cannot {attrs.verb} resource {go_quote(resource)} "
        f"in API group {go_quote(attrs.group)} {scope}"
    ).translate(_SANITIZE)
    if reason:
        message = f"{message}: {reason}"
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    subject = f"{qualified} {go_quote(attrs.name)}" if attrs.name else qualified
    details = {"name": attrs.name, "group": attrs.group, "kind": attrs.resource}
    return StatusError(
        403, "Forbidden", f"{subject} is forbidden: {message}", details={k: v for k, v in details.items() if v}
    )


def authorization_failed() -> StatusError:
    """The answer when no authorization decision could be had (fail closed, retryable)."""
    message = "authorization check failed: the upstream did not answer the SubjectAccessReview"
    return StatusError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        details={"causes": [{"message": message}]},
        retry_after=1,
    )


def decision_from_access_review(answer: dict[str, Any]) -> Decision:
    """The decision in a SubjectAccessReview answer; ReviewError if it is not one (or says both)."""
    status = answer.get("status")
    if not isinstance(status, dict):
        raise ReviewError("SubjectAccessReview answer has no status")
    allowed = status.get("allowed") is True
    denied = status.get("denied") is True
    if allowed and denied:
        raise ReviewError("SubjectAccessReview answer is both allowed and denied")
    reason = status.get("reason") or ""
    if not isinstance(reason, str):
        raise ReviewError("SubjectAccessReview answer: status.reason is not a string")
    return Decision(allowed, reason)


_Key = tuple[str, str, tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...], Attributes]


class SubjectAccessReviewer:
    """``SubjectAccessReview`` per (user, attributes), cached (allow 10 s, deny 2 s), single flight."""

    def __init__(
        self,
        client: ReviewClient,
        *,
        allow_ttl: float = 10.0,
        deny_ttl: float = 2.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.cache: ReviewCache[_Key, Decision] = ReviewCache(
            allow_ttl=allow_ttl, deny_ttl=deny_ttl, max_entries=max_entries, clock=clock
        )
        # Requests that failed because a review got no answer (each one a 500).
        self.failures = 0

    async def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The decision for ``user`` doing ``attrs``. Raises a 500 StatusError when there is none."""
        key: _Key = (user.username, user.uid, user.groups, user.extra_items(), attrs)
        try:
            return await self.cache.get(key, lambda: self._review(user, attrs), lambda d: d.allowed)
        except Exception:
            self.failures += 1
            raise authorization_failed() from None

    async def _review(self, user: UserInfo, attrs: Attributes) -> Decision:
        kind = "nonResourceAttributes" if isinstance(attrs, NonResourceAttributes) else "resourceAttributes"
        spec: dict[str, Any] = {kind: attrs.to_spec(), "user": user.username}
        if user.groups:
            spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        if user.uid:
            spec["uid"] = user.uid
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        try:
            decision = decision_from_access_review(await self.client.post(ACCESS_REVIEW_PATH, body))
        except Exception as e:
            log.warning("subject access review failed, answering 500: %s", e)
            raise
        log.debug(
            "access review: %s %s %s: %s",
            user.username,
            attrs.verb,
            attrs.path if isinstance(attrs, NonResourceAttributes) else attrs.resource,
            "allowed" if decision.allowed else "denied",
        )
        return decision

"""Kubernetes ``Status`` errors: the one way any layer reports a failure to a client.

Every error that reaches a client is a ``metav1.Status`` object with the code and
reason kube-apiserver would use (see ``k8s.io/apimachinery/pkg/api/errors``), so
clients' retry logic (``IsResourceExpired``, ``IsTooManyRequests``, ``Retry-After``)
works against us unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson

from watchcache.quoting import go_json_escape, go_quote


class StatusError(Exception):
    """An API error that carries its own ``Status`` body."""

    # The media type of ``body()``; a client that negotiated protobuf gets its Status in protobuf.
    content_type = "application/json"

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after: int | None = None,
        list_continue: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        # An explicit ``{}`` is kept: kube writes ``"details": {}`` on some errors (a path not found,
        # a forbidden non-resource path), and omits the field when it has none.
        self.details = dict(details) if details is not None else None
        self.retry_after = retry_after
        # kube-apiserver puts an "inconsistent continue" token in the Status metadata
        # of a 410 for an expired continue token, so the client can go on if it wants.
        self.list_continue = list_continue
        if retry_after is not None:
            self.details = self.details or {}
            self.details["retryAfterSeconds"] = retry_after

    def to_status(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.list_continue:
            metadata["continue"] = self.list_continue
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # StatusReasonUnknown is "", which kube omits (omitempty)
            status["reason"] = self.reason
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status

    def json(self) -> bytes:
        """The Status as compact JSON (an ERROR watch event's object)."""
        return go_json_escape(orjson.dumps(self.to_status()))

    def body(self) -> bytes:
        """An answer's body: kube's json.Encoder ends it with a newline (and escapes as Go does)."""
        return go_json_escape(orjson.dumps(self.to_status())) + b"\n"

    def __repr__(self) -> str:
        return f"StatusError({self.code}, {self.reason!r}, {self.message!r})"


def status_body(code: int, reason: str, message: str) -> bytes:
    """Encode a bare Status; for layers (the HTTP parser) that have no richer error."""
    return StatusError(code, reason, message).body()


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> StatusError:
    """422 Invalid; ``causes`` are (field, reason, message) as in ``field.ErrorList``."""
    qualified = f"{kind}.{group}" if group else kind
    text = ", ".join(f"{field}: {msg}" for field, _, msg in causes)  # as utilerrors.NewAggregate
    message = f'{qualified} "{name}" is invalid: ' + ("[" + text + "]" if len(causes) > 1 else text)
    # kube's StatusDetails: name and group are omitted when empty (ListOptions has no name).
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return StatusError(422, "Invalid", message, details=details)


def invalid_list_options(causes: list[tuple[str, str, str]]) -> StatusError:
    """What ``ValidateListOptions`` returns for a forbidden parameter combination."""
    return invalid("ListOptions", "meta.k8s.io", "", causes)


def not_found(group: str, resource: str, name: str) -> StatusError:
    return StatusError(
        404,
        "NotFound",
        f'{_qualified(group, resource)} "{name}" not found',
        details={"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource},
    )


def path_not_found() -> StatusError:
    return StatusError(404, "NotFound", "the server could not find the requested resource", details={})


def already_exists(group: str, resource: str, name: str) -> StatusError:
    details = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return StatusError(409, "AlreadyExists", f'{_qualified(group, resource)} "{name}" already exists', details=details)


def conflict(group: str, resource: str, name: str, why: str) -> StatusError:
    details = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(group, resource)} "{name}": {why}',
        details=details,
    )


def method_not_supported(group: str, resource: str, action: str) -> StatusError:
    return StatusError(
        405,
        "MethodNotAllowed",
        f"{action} is not supported on resources of kind {go_quote(_qualified(group, resource))}",  # %q
        details={"kind": resource, "group": group} if group else {"kind": resource},
    )


def resource_expired(message: str, list_continue: str | None = None) -> StatusError:
    """410 Expired: the requested resourceVersion left the history window."""
    return StatusError(410, "Expired", message, list_continue=list_continue)


def too_large_resource_version(wanted: int, current: int, retry_seconds: int = 1) -> StatusError:
    """504 Timeout with the cause clients test for (``IsTooLargeResourceVersion``)."""
    err = StatusError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {wanted}, current: {current}",  # kube's NewTimeoutError
        details={"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]},
        retry_after=retry_seconds,
    )
    return err


def too_many_requests(message: str, retry_seconds: int = 1) -> StatusError:
    return StatusError(429, "TooManyRequests", message, retry_after=retry_seconds)


def unsupported_media_type(content_type: str) -> StatusError:
    accepted = (
        "application/json, application/merge-patch+json, application/json-patch+json, "
        "application/strategic-merge-patch+json"
    )
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {accepted}; "
        f"got {go_quote(content_type)}",
    )


def request_entity_too_large(message: str) -> StatusError:
    return StatusError(413, "RequestEntityTooLarge", message)


def internal_error(message: str = "an internal error occurred") -> StatusError:
    return StatusError(500, "InternalError", message)

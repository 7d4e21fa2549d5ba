"""The error type selector parsing raises, and its one special case (a field the resource cannot select)."""

from __future__ import annotations


class SelectorError(ValueError):
    """A label or field selector the client sent cannot be used.

    ``str(err)`` is worded like k8s.io/apimachinery's (or kube-apiserver's) message for
    the same input, because it goes back to the client verbatim in a 400 BadRequest
    ``Status`` and people paste those into searches.
    """


class UnsupportedFieldError(SelectorError):
    """A field selector names a field the resource cannot select (``field``); the caller words it
    for the resource's kind, as kube-apiserver's conversion functions do."""

    def __init__(self, field: str) -> None:
        super().__init__(f"field label not supported: {field}")
        self.field = field

"""The one error type selector parsing raises."""

from __future__ import annotations


class SelectorError(ValueError):
    """A label or field selector the client sent cannot be used.

    ``str(err)`` is worded like k8s.io/apimachinery's (or kube-apiserver's) message for
    the same input, because it goes back to the client verbatim in a 400 BadRequest
    ``Status`` and people paste those into searches.
    """

"""Which requests are long-running, and kube's answer to one that ran out of time (--request-timeout).

kube-apiserver's ``LongRunningRequestCheck`` (controlplane/apiserver/config.go) and its timeout
filter: a long-running request has no request deadline and holds no in-flight seat once it streams
(a watch counts toward --max-watchers instead); any other one is ended at --request-timeout.
"""

from __future__ import annotations

from watchcache import apierrors
from watchcache.http.routing import RequestInfo

# kube-apiserver's LongRunningRequestCheck: these verbs and subresources.
_LONG_RUNNING_VERBS = frozenset({"watch", "proxy"})
_LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "log", "portforward", "proxy"})


def long_running(info: RequestInfo) -> bool:
    """As kube-apiserver: a watch (a GET, never a POST with ``?watch``), or a streaming subresource."""
    return info.verb in _LONG_RUNNING_VERBS or (
        info.is_resource_request and info.subresource in _LONG_RUNNING_SUBRESOURCES
    )


def request_timed_out() -> apierrors.StatusError:
    """kube-apiserver's answer to a request its timeout filter ended before it answered."""
    return apierrors.StatusError(
        504,
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
        details={},
    )

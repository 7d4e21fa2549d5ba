"""Upstream failures classified for operators (``upstream/failures.py``)."""

from __future__ import annotations

import logging
import ssl

import aiohttp
import pytest

from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.upstream.client import UpstreamError, WatchStalled
from watchcache.upstream.credentials import CredentialError
from watchcache.upstream.failures import LastFailures, classify

PODS = ResourceRegistry().get("", "v1", "pods")
SERVER = "https://10.0.0.1:6443"


def status(code: int, reason: str, message: str) -> UpstreamError:
    return UpstreamError(code, message, {"kind": "Status", "code": code, "reason": reason, "message": message})


def ssl_error(reason: str) -> aiohttp.ClientConnectorSSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] {reason.lower()} (_ssl.c:1006)")
    error.reason = reason
    key = aiohttp.client_reqrep.ConnectionKey("10.0.0.1", 6443, True, True, None, None, None)
    return aiohttp.ClientConnectorSSLError(key, error)


@pytest.mark.parametrize(
    ("error", "reason", "hint"),
    [
        (status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:wc:wc" cannot watch resource '
                                  '"pods" in API group "" at the cluster scope'),
         "forbidden", 'grant system:serviceaccount:wc:wc the verbs get, list and watch on "pods" in API group "", '
                      "cluster-wide (it lacks watch"),
        (status(401, "Unauthorized", "Unauthorized"), "unauthorized", "refuses watchcache's own credential (token)"),
        (status(404, "NotFound", "the server could not find the requested resource"), "not-found",
         "does not serve pods"),
        (status(429, "TooManyRequests", "slow down"), "throttled", "priority and fairness"),
        (status(503, "ServiceUnavailable", "etcd"), "server-error", "retries with backoff"),
        (ssl_error("WRONG_VERSION_NUMBER"), "not-tls", f"the upstream does not speak TLS at {SERVER}"),
        (ssl_error("CERTIFICATE_VERIFY_FAILED"), "certificate", "certificate-authority(-data) and tls-server-name"),
        (CredentialError("exec plugin 'aws' exited with 255: no SSO session"), "credential", "exec credential plugin"),
        (ConnectionRefusedError(111, "Connection refused"), "refused", f"nothing accepts connections at {SERVER}"),
        (TimeoutError(), "timeout", "did not answer in time"),
        (WatchStalled("no data for 75s"), "stalled", "re-established"),
    ],
)  # fmt: skip
def test_classify(error: BaseException, reason: str, hint: str) -> None:
    failure = classify(error, "watch", PODS, SERVER, "token")
    assert failure.reason == reason
    assert hint in failure.hint, failure.hint
    assert failure.level == (logging.ERROR if reason in ("forbidden", "unauthorized", "not-found", "not-tls",
                                                         "certificate", "credential") else logging.WARNING)  # fmt: skip


def test_a_custom_resource_gone_from_the_upstream_is_churn_not_a_configuration_error() -> None:
    """A CRD deleted while its kind is cached: the reflector's relist gets 404 before the CRD cache shows the
    deletion and stops the cache. That is the cluster's life, not an operator's mistake: a warning."""
    things = ResourceType("example.com", "v1", "things", "Thing", namespaced=True)  # a kind served by a CRD
    gone = status(404, "NotFound", "the server could not find the requested resource")
    failure = classify(gone, "list", things, SERVER)
    assert failure.reason == "not-found" and failure.level == logging.WARNING
    assert "CustomResourceDefinition was deleted" in failure.hint
    assert classify(gone, "list", PODS, SERVER).level == logging.ERROR  # a built-in kind not served: configuration


def test_the_same_failure_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    failures = LastFailures(SERVER)
    error = status(403, "Forbidden", 'pods is forbidden: User "u" cannot list resource "pods" in API group ""')
    with caplog.at_level(logging.WARNING, logger="watchcache.upstream"):
        for _ in range(5):
            failures.failed(PODS, "list", error, 1.0)
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.ERROR
    assert failures.counts[(PODS, "forbidden")] == 5 and PODS in failures.failing
    failures.succeeded(PODS)
    assert PODS not in failures.failing and failures.for_resource(PODS) is not None  # the last one stays

"""Request paths read as kube-apiserver's RequestInfoFactory reads them."""

from __future__ import annotations

import pytest

from watchcache.http.routing import parse_request_info


def test_segments_after_a_subresource_belong_to_it() -> None:
    """``services/name/proxy/any/path`` (and pods', nodes'): passed through, never a 400 here."""
    info = parse_request_info("GET", "/api/v1/namespaces/ns/services/https:web:443/proxy/a/b/c", False)
    assert (info.resource, info.name, info.subresource, info.namespace) == ("services", "https:web:443", "proxy", "ns")
    info = parse_request_info("GET", "/api/v1/nodes/n1/proxy/metrics/cadvisor", False)
    assert (info.resource, info.name, info.subresource, info.verb) == ("nodes", "n1", "proxy", "get")


def test_exec_subresource() -> None:
    info = parse_request_info("POST", "/api/v1/namespaces/ns/pods/p/exec", False)
    assert (info.verb, info.resource, info.name, info.subresource) == ("create", "pods", "p", "exec")


# Paths kube's router does not serve as the resource they seem to name (its answer, on the kit): the
# cache must not answer them; they pass through as sent (``canonical=False``).
NOT_CANONICAL = [
    pytest.param("//api/v1/namespaces/ns/configmaps", id="leading-empty"),  # its mux: text 404
    pytest.param("/api/v1/namespaces/ns//configmaps", id="inner-empty"),  # NotFound Status
    pytest.param("/api//v1/namespaces/ns/configmaps/cm-1", id="empty-version"),
    pytest.param("/api/v1/namespaces/ns/configmaps/..", id="dotdot-name"),  # Name parameter invalid
    pytest.param("/api/v1/namespaces/ns/configmaps/%2e%2E", id="encoded-dotdot"),
    pytest.param("/api/v1/namespaces/ns/configmaps/.", id="dot-name"),
    pytest.param("/api/v1/namespaces/ns/./configmaps", id="dot-segment"),  # 404
    pytest.param("/api/v1/namespaces/ns/configmaps/a%2Fb", id="encoded-slash"),  # 404: it splits the name
    pytest.param("/api/v1/namespaces/ns/configmaps/a%2fb/status", id="encoded-slash-status"),
    pytest.param("/api/v1/namespaces/a%2Fb/configmaps", id="encoded-slash-namespace"),
    pytest.param("/api/v1/namespaces/ns/configmaps/cm%00x", id="nul"),  # 404 naming "cm\x00x"
    pytest.param("/api/v1/namespaces/ns/configmaps/cm-%FF", id="escape-not-utf8"),  # 404 naming its bytes
    pytest.param("/api/v1/namespaces/ns/configmaps/cm-\xc3\xa9", id="raw-bytes"),  # (latin-1 of the bytes)
    pytest.param("/api/v1/namespaces/ns/configmaps/cm%zz", id="bad-escape"),  # Go's text 400
    pytest.param("/api/v1/namespaces/ns/configmaps/cm%4", id="truncated-escape"),
]


@pytest.mark.parametrize("raw", NOT_CANONICAL)
def test_a_path_kube_routes_otherwise_is_not_canonical(raw: str) -> None:
    for method in ("GET", "POST"):
        info = parse_request_info(method, raw, False)
        assert not info.canonical
        assert parse_request_info(method, raw, False) is info  # remembered, as a canonical path is


def test_a_non_canonical_path_is_read_as_kubes_request_info_reads_it() -> None:
    """For what it costs (a watch is long-running, flow control classifies it), never for the cache:
    kube's RequestInfoFactory decodes the path, trims its slashes and keeps the empty segments."""
    info = parse_request_info("GET", "//api/v1/services", True)
    assert (info.is_resource_request, info.verb, info.resource, info.canonical) == (True, "watch", "services", False)
    info = parse_request_info("GET", "/api/v1/namespaces/ns/configmaps/a%2Fb", False)
    assert (info.resource, info.name, info.subresource) == ("configmaps", "a", "b")
    info = parse_request_info("GET", "//api/v1/watch", False)  # kube's factory fails; its mux 404s
    assert (info.is_resource_request, info.canonical) == (False, False)


@pytest.mark.parametrize("raw", ["/api/v1/watch", "/apis/apps/v1/watch/", "/api/v1/watch//"])
def test_a_watch_prefix_without_a_resource_is_not_canonical(raw: str) -> None:
    """kube's RequestInfoFactory fails on it ("unable to determine kind and namespace from url") and
    answers 500: passed through for that answer, never read as a resource."""
    for watch in (False, True):
        info = parse_request_info("GET", raw, watch)
        assert (info.is_resource_request, info.canonical) == (False, False)


CANONICAL = [
    # (path, resource, namespace, name): the same resource to kube (checked on the kit)
    pytest.param("/api/v1/namespaces/ns/configmaps/", "configmaps", "ns", "", id="trailing-slash"),
    pytest.param("/api/v1/namespaces/ns/configmaps/cm-1//", "configmaps", "ns", "cm-1", id="trailing-slashes"),
    pytest.param("/api/v1/namespaces/ns/configm%61ps", "configmaps", "ns", "", id="escaped-letter"),
    pytest.param("/api/v1/namespaces/ns%2D1/configmaps/cm%2E1", "configmaps", "ns-1", "cm.1", id="escaped-name"),
    pytest.param("/api/v1/namespaces/ns/configmaps/cm..1", "configmaps", "ns", "cm..1", id="dots-inside"),
]


@pytest.mark.parametrize(("raw", "resource", "namespace", "name"), CANONICAL)
def test_a_path_kube_routes_the_same_is_canonical(raw: str, resource: str, namespace: str, name: str) -> None:
    info = parse_request_info("GET", raw, False)
    assert info.canonical and (info.resource, info.namespace, info.name) == (resource, namespace, name)

"""Request paths read as kube-apiserver's RequestInfoFactory reads them."""

from __future__ import annotations

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

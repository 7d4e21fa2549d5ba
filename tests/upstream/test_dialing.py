"""Which proxy an upstream connection goes through (``upstream/dialing.py``): proxy-url, else the
environment as Go's ``http.ProxyFromEnvironment`` with client-go's NO_PROXY CIDRs."""

from __future__ import annotations

import pytest

from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.dialing import proxy_for

ENV = {"HTTPS_PROXY": "proxy.corp:3128", "HTTP_PROXY": "http://plain.corp:8080"}


@pytest.mark.parametrize(
    ("server", "env", "expected"),
    [
        ("https://10.0.0.1:6443", ENV, "http://proxy.corp:3128"),
        ("http://10.0.0.1:8080", ENV, "http://plain.corp:8080"),
        ("https://10.0.0.1:6443", {"https_proxy": "socks5://s:1080"}, "socks5://s:1080"),
        ("https://127.0.0.1:6443", ENV, None),  # loopback: never an environment proxy, as Go
        ("https://localhost:6443", ENV, None),
        ("https://[::1]:6443", ENV, None),
        ("https://10.0.0.1:6443", {**ENV, "NO_PROXY": "10.0.0.0/8"}, None),  # client-go's CIDR entries
        ("https://10.0.0.1:6443", {**ENV, "NO_PROXY": "192.168.0.0/16"}, "http://proxy.corp:3128"),
        ("https://api.eks.amazonaws.com", {**ENV, "NO_PROXY": ".amazonaws.com"}, None),
        ("https://amazonaws.com", {**ENV, "NO_PROXY": ".amazonaws.com"}, "http://proxy.corp:3128"),  # subdomains only
        ("https://api.eks.amazonaws.com", {**ENV, "NO_PROXY": "*.amazonaws.com"}, None),
        ("https://api.eks.amazonaws.com", {**ENV, "no_proxy": "amazonaws.com"}, None),
        ("https://notamazonaws.com", {**ENV, "NO_PROXY": "amazonaws.com"}, "http://proxy.corp:3128"),
        ("https://api:6443", {**ENV, "NO_PROXY": "api:443"}, "http://proxy.corp:3128"),  # another port
        ("https://api:6443", {**ENV, "NO_PROXY": "api:6443"}, None),
        ("https://api:6443", {**ENV, "NO_PROXY": "*"}, None),
        ("https://api:6443", {}, None),
    ],
)
def test_environment_proxy(server: str, env: dict[str, str], expected: str | None) -> None:
    assert proxy_for(UpstreamConfig(server=server), env) == expected


def test_proxy_url_wins_even_for_loopback() -> None:
    config = UpstreamConfig(server="https://127.0.0.1:6443", proxy_url="socks5://127.0.0.1:1080")
    assert proxy_for(config, ENV) == "socks5://127.0.0.1:1080"

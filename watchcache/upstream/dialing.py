"""How connections to the upstream are made: direct, or through a proxy, as client-go makes them.

The proxy is the kubeconfig cluster's ``proxy-url`` (``http``, ``https`` or ``socks5``); without one,
``HTTPS_PROXY``/``HTTP_PROXY`` and ``NO_PROXY`` (host names, domain suffixes, IP addresses and CIDRs),
as client-go's default transport (``utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)``);
as Go, a loopback upstream is never sent to an environment proxy.

- aiohttp sessions: an http(s) proxy is aiohttp's own (``CONNECT`` for an https upstream, the
  absolute form for an http one, as Go's transport); socks5 is aiohttp-socks' connector (names are
  resolved by the proxy, as Go's socks5 dialer does), with TLS started here so ``tls-server-name``
  holds through it.
- tunnels (exec, attach, port-forward) open their own connections: ``open_connection`` goes
  through python-socks' ``CONNECT``/SOCKS5 client, then TLS to the upstream over it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp_socks import ProxyConnector
from python_socks import ProxyError, parse_proxy_url
from python_socks.async_.asyncio.v2 import Proxy

from watchcache.upstream.config import UpstreamConfig

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _no_proxy_matches(host: str, port: int, no_proxy: str) -> bool:
    """Go's httpproxy ``useProxy`` rules for NO_PROXY entries, with client-go's CIDR entries."""
    host = host.lower().strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry and ip is not None:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.strip("[]")
        if ip is not None:
            if name == host:
                return True
            continue
        if name.startswith("*."):
            name = name[1:]
        # ".example.com": its subdomains only; "example.com": itself and its subdomains (Go's domainMatch).
        if host.endswith(name if name.startswith(".") else "." + name) or host == name:
            return True
    return False


def proxy_for(config: UpstreamConfig, env: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL for connections to ``config.server`` (None: direct)."""
    if config.proxy_url:
        return config.proxy_url
    env = os.environ if env is None else env
    url = urlsplit(config.server)
    host = url.hostname or ""
    if _is_loopback(host):
        return None
    tls = url.scheme == "https"
    names = ("HTTPS_PROXY", "https_proxy") if tls else ("HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), None)
    if not proxy:
        return None
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    if _no_proxy_matches(host, url.port or (443 if tls else 80), no_proxy):
        return None
    return proxy if "://" in proxy else "http://" + proxy


class _SocksConnector(ProxyConnector):
    """aiohttp-socks' connector, with TLS to the upstream started here so its name can be
    ``tls-server-name`` rather than the host dialled (aiohttp-socks always uses the host)."""

    def __init__(self, url: str, server_hostname: str | None, **kwargs: Any) -> None:
        proxy_type, host, port, username, password = parse_proxy_url(url)
        super().__init__(
            host=host, port=port, proxy_type=proxy_type, username=username, password=password, rdns=True, **kwargs
        )
        self._server_hostname = server_hostname

    async def _connect_via_proxy(
        self, host: str, port: int, ssl: ssl.SSLContext | None = None, timeout: float | None = None
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        proxy = Proxy(
            proxy_type=self._proxy_type,
            host=self._proxy_host,
            port=self._proxy_port,
            username=self._proxy_username,
            password=self._proxy_password,
            rdns=self._rdns,
        )
        stream = await proxy.connect(dest_host=host, dest_port=port, timeout=timeout)
        if ssl is not None:
            stream = await stream.start_tls(hostname=self._server_hostname or host, ssl_context=ssl)
        writer = stream.writer
        transport = writer.transport
        protocol = ResponseHandler(self._loop)
        # python-socks' stream writer holds the transport; keep it alive with the protocol.
        protocol._watchcache_writer = writer  # type: ignore[attr-defined]  # noqa: SLF001 (our own attribute)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return transport, protocol  # type: ignore[return-value]


def session_options(config: UpstreamConfig, context: ssl.SSLContext | None) -> dict[str, Any]:
    """``aiohttp.ClientSession`` keyword arguments: the connector and, for an http(s) proxy, ``proxy``."""
    proxy = proxy_for(config)
    if proxy is not None and proxy.startswith("socks5"):
        return {"connector": _SocksConnector(proxy, config.tls_server_name, ssl=context or False, limit=0)}
    options: dict[str, Any] = {"connector": aiohttp.TCPConnector(ssl=context or False, limit=0)}
    if proxy is not None:
        options["proxy"] = proxy
    return options


async def open_connection(
    config: UpstreamConfig,
    protocol_factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None,
    server_hostname: str | None,
) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
    """A connection of its own to the upstream (a tunnel's), through the proxy if there is one."""
    loop = asyncio.get_running_loop()
    proxy = proxy_for(config)
    if proxy is None:
        return await loop.create_connection(
            protocol_factory, host, port, ssl=ssl_context, server_hostname=server_hostname
        )
    proxy_ssl = None
    if proxy.startswith("https://"):
        # As aiohttp's https proxies (and Go's): the upstream's TLS settings verify the proxy too.
        proxy_ssl = ssl_context or ssl.create_default_context()
        proxy = "http://" + proxy.removeprefix("https://")
    try:
        stream = await Proxy.from_url(proxy, rdns=True, proxy_ssl=proxy_ssl).connect(dest_host=host, dest_port=port)
    except ProxyError as e:  # the proxy refused (its connection errors are OSErrors already)
        raise OSError(f"proxy {urlsplit(proxy).netloc.rpartition('@')[2]} refused: {e}") from None
    transport = stream.writer.transport
    if proxy_ssl is None:
        # A plain connection to the proxy: take its socket over, so the upstream connection is made
        # as a direct one is (TLS by the loop, the protocol the loop's own). Python-socks' stream,
        # its TLS started on top and its protocol swapped, let EOF overtake paused data.
        raw = transport.get_extra_info("socket")
        sock = socket.socket(fileno=os.dup(raw.fileno()))
        transport.abort()
        return await loop.create_connection(
            protocol_factory, sock=sock, ssl=ssl_context, server_hostname=server_hostname if ssl_context else None
        )
    # An https proxy: TLS to the upstream inside TLS to the proxy, on python-socks' stream.
    if ssl_context is not None:
        stream = await stream.start_tls(hostname=server_hostname or host, ssl_context=ssl_context)
        transport = stream.writer.transport
    protocol = protocol_factory()
    # The stream's writer owns the transport (and, over TLS, the layers under it): keep it with the protocol.
    protocol._watchcache_writer = stream.writer  # type: ignore[attr-defined]  # noqa: SLF001 (our own attribute)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    return transport, protocol

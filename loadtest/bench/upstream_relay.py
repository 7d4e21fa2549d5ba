"""Helper process: a counting relay between the proxy and its upstream (``python -m loadtest.bench.upstream_relay``).

The proxy is pointed at ``http://127.0.0.1:<port>`` (plain HTTP on loopback, with its bearer token);
each connection is relayed to the upstream over TLS, bytes untouched. The proxy-to-upstream
direction is parsed with httptools and every request counted by kind and resource: ``list`` (a
LIST's first page), ``list-page`` (its next pages), ``list-limit1`` (a consistent read's proof),
``watch``, ``get``, writes by method, ``review`` (TokenReview, SubjectAccessReview) and
``discovery``. That is how "requests that reached the upstream" is measured independently of
the proxy's own metrics.

Commands: ``counts`` → ``{"kind resource": n}``; ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import re
import ssl
from urllib.parse import parse_qs, urlsplit

import httptools

from loadtest.bench import helperio
from loadtest.bench.lib import raise_nofile

_RESOURCE = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/([a-z.]+)(?:/([^/]+))?(?:/([a-z]+))?$")


def classify(method: str, target: str) -> str:
    parts = urlsplit(target)
    q = parse_qs(parts.query)
    m = _RESOURCE.match(parts.path)
    resource = m.group(1) if m else "-"
    if resource in ("tokenreviews", "subjectaccessreviews"):
        return f"review {resource}"
    if method != "GET":
        return f"{method.lower()} {resource}"
    if q.get("watch", [""])[0] in ("1", "true"):
        return f"watch {resource}"
    if m and m.group(2) and not m.group(3):
        return f"get {resource}"
    if m and q.get("continue", [""])[0]:
        return f"list-page {resource}"  # the next page of a LIST already counted
    if m:
        return f"{'list-limit1' if q.get('limit', [''])[0] == '1' else 'list'} {resource}"
    return "discovery -"


class _Parser:
    def __init__(self, counts: collections.Counter[str]) -> None:
        self.counts = counts
        self.url = b""
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_headers_complete(self) -> None:
        # Counted when the request arrives (a watch's response never completes).
        self.counts[classify(self.parser.get_method().decode(), self.url.decode("latin-1"))] += 1


async def main_async(args: argparse.Namespace) -> None:
    up = urlsplit(args.upstream)
    ctx = ssl.create_default_context(cafile=args.ca or None)
    if not args.ca:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    counts: collections.Counter[str] = collections.Counter()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: _Parser | None) -> None:
        try:
            while data := await reader.read(1 << 18):
                if parser is not None:
                    with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
                        parser.parser.feed_data(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(up.hostname, up.port, ssl=ctx, limit=1 << 20)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w, _Parser(counts)), pipe(up_r, client_w, None))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20)
    port = server.sockets[0].getsockname()[1]
    helperio.emit({"event": "ready", "url": f"http://127.0.0.1:{port}"})
    async for cmd in helperio.commands():
        if cmd["cmd"] == "counts":
            helperio.emit(dict(counts))
    server.close()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    raise_nofile()
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--upstream", required=True, help="https://host:port")
    p.add_argument("--ca", default="", help="CA to verify the upstream (default: none)")
    uvloop.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()

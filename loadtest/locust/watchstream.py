"""One WATCH request on its own connection, read event by event without blocking the gevent loop.

Why geventhttpclient directly rather than ``FastHttpUser.client.get(..., stream=True)``: locust's
streaming response only offers ``iter_content(n)``, whose ``read(n)`` waits until ``n`` bytes have
arrived, so an event could sit in the socket buffer until later events fill the chunk. The
parser's ``readline`` (below) returns as soon as one newline-terminated event is buffered, and its
``recv`` is a gevent socket's: a greenlet waiting for the next event yields to every other user.
A watch also wants its own connection: the stream holds it for minutes, and its read timeout
must outlast the gaps between events (bookmarks come every ``bookmark_interval``, 1 min in
watchcache as in kube-apiserver), unlike a LIST's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gevent.ssl
import orjson
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL


class WatchRejected(Exception):
    """The server answered the WATCH with an HTTP error (not an ERROR event)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


@dataclass(slots=True)
class WatchEvent:
    type: str
    object: dict[str, Any]
    received_at: float  # time.time() when its line was read, before parsing
    size: int

    @property
    def rv(self) -> int:
        return int(self.object.get("metadata", {}).get("resourceVersion") or 0)

    @property
    def key(self) -> str:
        meta = self.object.get("metadata", {})
        namespace = meta.get("namespace")
        return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _unverified_context(**kwargs: Any) -> gevent.ssl.SSLContext:
    # Same as locust's FastHttpUser (insecure=True): a load generator does not verify the server.
    return gevent.ssl._create_unverified_context(**kwargs)


class WatchConnection:
    """A keep-alive connection that carries one watch at a time (concurrency 1)."""

    def __init__(self, base_url: str, headers: dict[str, str], *, network_timeout: float) -> None:
        self._headers = dict(headers)
        self._client = HTTPClient.from_url(
            URL(base_url),
            concurrency=1,
            network_timeout=network_timeout,
            connection_timeout=10.0,
            ssl_context_factory=_unverified_context,
            insecure=True,
        )

    def open(self, path: str) -> Iterator[WatchEvent]:
        """Send the WATCH and return its events; raises ``WatchRejected`` on an HTTP error.

        The request is sent and the status checked before this returns (the caller times it);
        the iterator ends when the server ends the stream (timeoutSeconds) and raises on a broken
        connection (``OSError``, geventhttpclient's ``HTTPParseError``).
        """
        response = self._client.get(path, headers=self._headers)
        if response.status_code != 200:
            body = response.read()
            response.release()
            raise WatchRejected(response.status_code, body)
        return _events(response)

    def close(self) -> None:
        self._client.close()


def _events(response: Any) -> Iterator[WatchEvent]:
    try:
        while True:
            line = response.readline(b"\n")
            if not line:
                return  # the chunked body ended: the server closed the watch
            received = time.time()
            if line.isspace():
                continue
            event = orjson.loads(line)
            yield WatchEvent(event["type"], event["object"], received, len(line))
    finally:
        response.release()

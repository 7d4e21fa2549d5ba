"""Informer-style watch clients that record everything they see, for the checker.

Each ``Informer`` does what a client-go reflector does, over raw HTTP (aiohttp):

1. LIST, paged (``limit``/``continue``): ``resourceVersion=0`` (any cached state) or unset
   (a consistent read), as configured; a failed page restarts the list;
2. WATCH from the list's rv with ``allowWatchBookmarks=true`` and a ``timeoutSeconds``;
3. when the stream ends (timeout, server shutdown, broken connection), WATCH again from the
   newest rv seen (event or bookmark), after a short backoff on errors;
4. on 410 Gone (HTTP status or ERROR event) LIST again; on any other error (a 429: retry later)
   back off and WATCH again from the same rv.

Every step is appended to ``records`` in the checker's format (``harness.checker``).
Connections are never reused (``force_close``), so with SO_REUSEPORT each watch lands on
any worker, as a fleet of real clients would. Every wait is bounded; ``stop`` ends the loop.

Why a reflector of its own beside ``harness.reflector``: this one is asynchronous (a campaign runs
a hundred of them on one event loop, with fault phases), pages with ``limit``/``continue`` as
configured per client, and records every event, bookmark and list for the checker (JSON only,
with digests); ``harness.reflector`` is one thread per informer, speaks each client-go flavor's
media types (protobuf, metadata, WatchList) and keeps only the store, to compare it with kube's.
``loadtest/bench/restart.py`` has a third, on raw sockets, that reads resourceVersions only: it
times a thousand informers, and this one's records would be the cost it measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from harness.checker import (
    BOOKMARK_T,
    ERROR_T,
    Record,
    WatchSpec,
    digest_of,
    object_key,
)

GONE = 410


def collection_path(spec: WatchSpec) -> str:
    if spec.namespace:
        return f"/api/v1/namespaces/{spec.namespace}/{spec.resource}"
    return f"/api/v1/{spec.resource}"


@dataclass
class InformerConfig:
    list_mode: str = "any"  # "any": resourceVersion=0; "consistent": unset
    page_size: int = 250
    watch_timeout: tuple[int, int] = (20, 40)  # timeoutSeconds drawn from [a, b]
    digests: bool = True
    backoff: tuple[float, float] = (0.05, 2.0)
    # No byte (not even a bookmark) for this long: the stream is given up and resumed (counted).
    stuck_after: float = 30.0
    request_timeout: float = 30.0


@dataclass
class Phase:
    """The campaign's current fault phase; clients mark their records with it."""

    index: int = 0
    name: str = "baseline"


@dataclass
class Counters:
    events: int = 0
    bookmarks: int = 0
    lists: int = 0
    watches: int = 0
    gone: int = 0
    errors: int = 0
    stuck: int = 0
    last_rv: int = 0


class Informer:
    def __init__(
        self,
        cid: str,
        base_url: str,
        spec: WatchSpec,
        session: aiohttp.ClientSession,
        config: InformerConfig | None = None,
        *,
        phase: Phase | None = None,
        seed: int = 0,
    ) -> None:
        self.id = cid
        self.base_url = base_url.rstrip("/")
        self.spec = spec
        self.session = session
        self.config = config or InformerConfig()
        self.phase = phase or Phase()
        self.rng = random.Random(seed)
        self.records: list[Record] = []
        # (record index, phase index): the phase in force from that record on.
        self.marks: list[tuple[int, int]] = [(0, self.phase.index)]
        self.counters = Counters()
        self.last_rv = 0
        # (wall-clock time, the rv the client stood at, the Status message) of every 410: for telling
        # who forced it, and showing why when the campaign puts one on the proxy.
        self.gone_at: list[tuple[float, int, str]] = []
        self._paused_until = 0.0
        self._stop = asyncio.Event()
        self._backoff = self.config.backoff[0]
        # The stream being read had an ERROR event other than 410.
        self._errored = False

    # ------------------------------------------------------------------ recording

    def _record(self, rec: Record) -> None:
        if self.phase.index != self.marks[-1][1]:
            self.marks.append((len(self.records), self.phase.index))
        self.records.append(rec)

    def pause(self, seconds: float) -> None:
        """Stop reading the watch stream for ``seconds`` (a slow consumer)."""
        self._paused_until = time.monotonic() + seconds

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    if not await self._list():
                        await self._sleep_backoff()
                        continue
                    need_list = False
                need_list = await self._watch()
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                self.counters.errors += 1
                self._record(("error", 0))
                await self._sleep_backoff()

    async def _sleep_backoff(self) -> None:
        delay = self.rng.uniform(self._backoff / 2, self._backoff)
        self._backoff = min(self._backoff * 2, self.config.backoff[1])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    def _params(self) -> dict[str, str]:
        return {"labelSelector": self.spec.label_selector} if self.spec.label_selector else {}

    async def _list(self) -> bool:
        """One complete paged LIST, recorded; False if it failed (nothing recorded but the error)."""
        url = self.base_url + collection_path(self.spec)
        params = {**self._params(), "limit": str(self.config.page_size)}
        if self.config.list_mode == "any":
            params["resourceVersion"] = "0"
        items: dict[str, int] = {}
        digests: dict[str, int] | None = {} if self.config.digests else None
        rv = 0
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout)
        while True:
            async with self.session.get(url, params=params, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status != 200:
                    self.counters.errors += 1
                    self._record(("error", resp.status if resp.status != GONE else 0))
                    return False
            page = orjson.loads(body)
            meta = page["metadata"]
            if not rv:
                rv = int(meta["resourceVersion"])
            for obj in page.get("items") or []:
                key = object_key(obj)
                items[key] = int(obj["metadata"]["resourceVersion"])
                if digests is not None:
                    digests[key] = digest_of(obj)
            token = meta.get("continue")
            if not token:
                break
            params = {**self._params(), "limit": str(self.config.page_size), "continue": token}
        self.counters.lists += 1
        self._record(("list", rv, items, digests))
        self.last_rv = rv
        self.counters.last_rv = max(self.counters.last_rv, rv)
        self._backoff = self.config.backoff[0]
        return True

    async def _watch(self) -> bool:
        """One watch request and its stream; True if the client must relist (410)."""
        lo, hi = self.config.watch_timeout
        params = {
            **self._params(),
            "watch": "1",
            "resourceVersion": str(self.last_rv),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.rng.randint(lo, hi)),
        }
        self.counters.watches += 1
        self._record(("reconnect", self.last_rv))
        url = self.base_url + collection_path(self.spec)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.request_timeout)
        async with self.session.get(url, params=params, timeout=timeout) as resp:
            if resp.status == GONE:
                self.counters.gone += 1
                self.gone_at.append((time.time(), self.last_rv, _status_message(await resp.read())))
                self._record(("error", GONE))
                self._record(("relist",))
                return True
            if resp.status != 200:
                await resp.read()
                self.counters.errors += 1
                self._record(("error", resp.status))
                await self._sleep_backoff()
                return False
            self._errored = False
            gone = await self._read_stream(resp)
        if gone:
            self._record(("relist",))
        elif self._errored:  # an ERROR event other than 410 (a 429: retry later): back off, keep the rv
            await self._sleep_backoff()
        return gone

    async def _read_stream(self, resp: aiohttp.ClientResponse) -> bool:
        pending = b""
        content = resp.content
        digests = self.config.digests
        while not self._stop.is_set():
            wait = self._paused_until - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, 1.0))
                continue
            try:
                async with asyncio.timeout(self.config.stuck_after):
                    chunk = await content.readany()
            except TimeoutError:
                self.counters.stuck += 1
                self._record(("error", 0))
                return False
            if not chunk:
                return False
            data = pending + chunk if pending else chunk
            lines = data.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if line and self._on_line(line, digests):
                    return True
        return False

    def _on_line(self, line: bytes, digests: bool) -> bool:
        """Record one watch event; True if it was a 410 ERROR."""
        event = orjson.loads(line)
        kind = event.get("type")
        obj: dict[str, Any] = event.get("object") or {}
        if kind == ERROR_T:
            code = int(obj.get("code") or 0)
            if code == GONE:
                self.counters.gone += 1
                self.gone_at.append((time.time(), self.last_rv, str(obj.get("message") or "")))
            else:
                self.counters.errors += 1
                self._errored = True
            self._record(("error", code))
            return code == GONE
        rv = int(obj["metadata"]["resourceVersion"])
        if rv > self.last_rv:
            self.last_rv = rv
        if rv > self.counters.last_rv:
            self.counters.last_rv = rv
        if kind == BOOKMARK_T:
            self.counters.bookmarks += 1
            self._record(("bookmark", rv))
        else:
            self.counters.events += 1
            self._record(("event", kind, object_key(obj), rv, digest_of(obj) if digests else None))
        self._backoff = self.config.backoff[0]
        return False


def _status_message(body: bytes) -> str:
    """A Status body's message, or the body's start when it is not one."""
    try:
        return str(orjson.loads(body).get("message") or "")
    except (orjson.JSONDecodeError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def small_receive_buffer(size: int = 32 << 10) -> Callable[..., socket.socket]:
    """A socket factory for aiohttp whose sockets have a small receive buffer (a slow reader fills fast)."""

    def factory(addr_info: Any) -> socket.socket:
        family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return sock

    return factory


def new_session(*, small_buffer: bool = False) -> aiohttp.ClientSession:
    """A session that opens a new connection per request (watches spread over the workers)."""
    kwargs: dict[str, Any] = {"force_close": True, "limit": 0}
    if small_buffer:
        kwargs["socket_factory"] = small_receive_buffer()
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(**kwargs),
        headers={"Accept": "application/json"},
        read_bufsize=1 << 16,
    )


@dataclass
class Fleet:
    """The clients of a campaign, by id."""

    informers: list[Informer] = field(default_factory=list)

    def specs(self) -> list[tuple[str, WatchSpec, list[Record]]]:
        return [(i.id, i.spec, i.records) for i in self.informers]


def default_mix(namespaces: int, count: int, *, transitions: bool = True) -> list[tuple[WatchSpec, InformerConfig]]:
    """``count`` watch specs: cluster-wide and namespaced pods, label selectors, configmaps.

    With ``transitions``, some selectors match labels that writes change (pods gaining a
    ``version`` label, configmaps flipping ``chaos-phase``), so objects enter and leave the
    selection; without, every selector matches labels that never change.
    """
    if transitions:
        pods_selectors = ["app=frontend", "tier in (web,cache)", "!version", "version", "app!=checkout,tier"]
        cm_selectors = ["chaos", "chaos-phase=a"]
    else:
        pods_selectors = ["app=frontend", "tier in (web,cache)", "app!=checkout,tier", "app in (auth,ledger)"]
        cm_selectors = ["chaos", "app.kubernetes.io/managed-by"]
    out: list[tuple[WatchSpec, InformerConfig]] = []
    i = 0
    while len(out) < count:
        slot = i % 10
        ns = f"ns-{(i // 10) % namespaces}"
        mode = "consistent" if i % 4 == 3 else "any"
        if slot in (0, 1, 2):
            spec = WatchSpec("pods")
        elif slot in (3, 4):
            spec = WatchSpec("pods", ns)
        elif slot == 5:
            spec = WatchSpec("pods", None, pods_selectors[(i // 10) % len(pods_selectors)])
        elif slot == 6:
            spec = WatchSpec("pods", ns, pods_selectors[(i // 10 + 1) % len(pods_selectors)])
        elif slot == 7:
            spec = WatchSpec("configmaps")
        elif slot == 8:
            spec = WatchSpec("configmaps", ns)
        else:
            spec = WatchSpec("configmaps", None, cm_selectors[(i // 10) % len(cm_selectors)])
        out.append((spec, InformerConfig(list_mode=mode)))
        i += 1
    return out

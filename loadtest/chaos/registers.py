"""Registers for the campaign's linearizability check: writers and consistent readers through the proxy.

``REGISTERS`` ConfigMaps ``reg-<i>`` in one namespace, each written by one sequential writer with
values 0, 1, 2, ... (``data.v``); a write that fails or gets no answer is tried again with the
same value until it succeeds, so each value is written once. Readers LIST the namespace, or GET
one register, without a resourceVersion (consistent reads: the proxy proves its cache fresh or
passes them through), all through the proxy, under the campaign's faults. Each call's start and
end are taken on this process's monotonic clock; ``harness.linearizability`` checks the
history. A read that fails (an error status, a reset) is not recorded: it returned nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time

import aiohttp

from harness.linearizability import History, Read

REGISTERS = 8
NAMESPACE = "ns-0"
_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError)


class Registers:
    def __init__(self, proxy_url: str, *, registers: int = REGISTERS, readers: int = 6, pause: float = 0.02) -> None:
        self.proxy_url = proxy_url
        self.names = [f"reg-{i}" for i in range(registers)]
        self.readers = readers
        self.pause = pause
        self.history = History()
        self.failed_reads = 0
        self.retried_writes = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def base(self) -> str:
        return f"{self.proxy_url}/api/v1/namespaces/{NAMESPACE}/configmaps"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=10)
        )
        for name in self.names:  # value 0: created (or, after an earlier run's leftovers, set)
            w = self.history.write_started(name, 0, time.monotonic())
            body = {"metadata": {"name": name, "namespace": NAMESPACE}, "data": {"v": "0"}}
            while not self._stop.is_set():
                status = await self._send("POST", self.base, body)
                if status == 409:
                    status = await self._send("PUT", f"{self.base}/{name}", body)
                if status in (200, 201):
                    break
                await asyncio.sleep(0.2)
            w.end = time.monotonic()
        self._tasks = [asyncio.ensure_future(self._writer(n)) for n in self.names]
        self._tasks += [asyncio.ensure_future(self._reader(i)) for i in range(self.readers)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _send(self, method: str, url: str, body: object) -> int:
        assert self._session is not None
        headers = {"Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"}
        try:
            async with self._session.request(method, url, data=json.dumps(body), headers=headers) as resp:
                await resp.read()
                return resp.status
        except _ERRORS:
            return 0

    async def _writer(self, name: str) -> None:
        value = 0
        while not self._stop.is_set():
            value += 1
            w = self.history.write_started(name, value, time.monotonic())
            while True:
                if await self._send("PATCH", f"{self.base}/{name}", {"data": {"v": str(value)}}) == 200:
                    w.end = time.monotonic()
                    break
                self.retried_writes += 1
                if self._stop.is_set():
                    return  # never acknowledged: its end stays unknown (INF)
                await asyncio.sleep(0.1)
            await self._pause()

    async def _reader(self, index: int) -> None:
        assert self._session is not None
        rng = random.Random(index)
        client = f"reader-{index}"
        while not self._stop.is_set():
            one = rng.random() < 0.3
            url = f"{self.base}/{rng.choice(self.names)}" if one else self.base
            start = time.monotonic()
            try:
                async with self._session.get(url) as resp:
                    body = await resp.read()
                    status = resp.status
                end = time.monotonic()
                if status != 200:
                    self.failed_reads += 1
                else:
                    doc = json.loads(body)
                    items = [doc] if one else doc.get("items", [])
                    values = {
                        i["metadata"]["name"]: int(i["data"]["v"])
                        for i in items
                        if i["metadata"]["name"] in self.history.writes
                    }
                    if not one:  # registers are never deleted: one missing from a LIST is a violation
                        values.update({n: -1 for n in self.names if n not in values})
                    self.history.reads.append(Read(client, start, end, values, "get" if one else "list"))
            except _ERRORS:
                self.failed_reads += 1
            await self._pause()

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.pause)

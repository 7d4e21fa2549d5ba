"""A sharded proxy (``watchcache serve --workers N``) on a fixed port, restarted as a rolling update or a
container kill would: the restart scenarios of the reliability and reference tiers and the startup
benchmark (``loadtest/bench/reference_startup``) drive it.

Its log appends across starts; each start is a ``harness.processes.Proc`` in its own session, so a
"container kill" (``sigkill_group``) takes the supervisor and every worker at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from harness.processes import SUPERVISOR_READY, Proc


@dataclass
class ProxyGroup:
    """``watchcache serve --workers N`` on a fixed port, restartable; its log appends across starts."""

    argv: list[str]
    log_path: Path
    port: int
    procs: list[Proc] = field(default_factory=list)
    ca_file: str | None = None  # it serves HTTPS with a certificate this CA signed
    resource: str = "configmaps"  # the resource whose owner worker_pids() names

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://127.0.0.1:{self.port}"

    @property
    def current(self) -> Proc:
        return self.procs[-1]

    async def start(self, timeout: float) -> float:
        """Start a new supervisor; the seconds until /readyz says every worker has synced."""
        t0 = time.monotonic()
        proc = Proc(self.argv, name="proxy", ready=SUPERVISOR_READY, log_path=self.log_path, new_session=True)
        self.procs.append(proc)
        proc.start()
        await asyncio.to_thread(proc.wait_ready, timeout)
        await wait_http_ok(self.url + "/readyz", timeout, self.ca_file)
        return time.monotonic() - t0

    async def sigterm(self, timeout: float) -> int | None:
        return await asyncio.to_thread(self.current.stop, timeout)

    def sigkill_group(self) -> None:
        """Every process of the group at once (a container kill); ours: the group's leader is our child."""
        self.current.kill()  # new_session: the whole group

    async def worker_pids(self, timeout: float) -> dict[int, tuple[int, bool]]:
        """worker id -> (pid, owns configmaps), from every worker's /debug/shards (fresh connections)."""
        views: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            while len(views) < 2 and time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                    async with s.get(self.url + "/debug/shards", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            view = orjson.loads(await r.read())
                            views[int(view["worker"])] = view
                await asyncio.sleep(0.005)
        return {w: (int(v["pid"]), self.resource in " ".join(v["owned"])) for w, v in views.items()}

    def stop(self) -> None:
        for proc in self.procs:
            if proc.running():
                proc.stop(30.0)

    def tracebacks(self) -> list[str]:
        return tracebacks(self.log_path)

    def relist_lines(self) -> list[str]:
        text = self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""
        return [ln.strip() for ln in text.splitlines() if "relisted" in ln or "caught up" in ln]


def tracebacks(log_path: Path) -> list[str]:
    """Every traceback in a proxy's log, each with the lines before it: a proxy logs none, whatever the fault."""
    text = log_path.read_text("utf-8", "replace") if log_path.exists() else ""
    out, at = [], text.find("Traceback")
    while at >= 0:
        out.append(text[max(0, at - 2000) : at + 3000])
        at = text.find("Traceback", at + 1)
    return out


async def wait_http_ok(url: str, timeout: float, ca_file: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    ssl_ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, ssl=ssl_ctx)) as s:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not 200 within {timeout:.0f}s")
            await asyncio.sleep(0.05)

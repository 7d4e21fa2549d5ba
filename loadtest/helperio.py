"""How an orchestrator drives its load-side helper processes: JSON lines on stdin and stdout.

A helper (``python -m loadtest.<module>``) prints one JSON object per line on stdout and reads
commands (``{"cmd": ...}``) one per line on stdin; ``Helper`` is the orchestrator's end.
Helpers run in their own processes so that their event loops never share the orchestrator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def raise_nofile(want: int = 1 << 20) -> int:
    """Raise this process's open-file limit: to ``want`` if allowed (root), else to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((want, want), (hard, hard)):
        if soft >= limit[0]:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Helper:
    """A helper process (``python -m module args``) driven with JSON lines."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name

    @classmethod
    async def start(cls, module: str, *args: str, name: str = "") -> Helper:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(ROOT),
            preexec_fn=raise_nofile,
            limit=256 << 20,
        )
        return cls(process, name or module)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def recv(self, timeout: float = 600.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"helper {self.name} exited (rc={await self.process.wait()})")
        return json.loads(line)

    async def send(self, cmd: str, **kw: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cmd": cmd, **kw}).encode() + b"\n")
        await self.process.stdin.drain()

    async def ask(self, cmd: str, timeout: float = 600.0, **kw: Any) -> dict[str, Any]:
        await self.send(cmd, **kw)
        return await self.recv(timeout)

    async def close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(Exception):
                await self.send("quit")
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def ask_all(helpers: list[Helper], cmd: str, timeout: float = 600.0, **kw: Any) -> list[dict[str, Any]]:
    for h in helpers:
        await h.send(cmd, **kw)
    return [await h.recv(timeout) for h in helpers]

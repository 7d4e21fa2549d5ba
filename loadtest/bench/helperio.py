"""The helper processes' side of the JSON-lines protocol with the orchestrator (``lib.Helper``): one JSON
object per line, commands on stdin, answers on stdout.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from collections.abc import AsyncIterator
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def command_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def commands() -> AsyncIterator[dict[str, Any]]:
    """The orchestrator's commands, one JSON object per line, until it sends ``quit`` or closes stdin
    (lines it sends meanwhile wait in the pipe: reading may start after the helper says it is ready)."""
    reader = await command_reader()
    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return
        yield cmd


def rusage_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

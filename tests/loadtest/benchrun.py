"""Run a benchmark as a newcomer would (``python -m loadtest.bench.NAME``) and read its ``BENCH`` line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from loadtest.bench import lib as bl


def bench_json(name: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """The JSON of the one ``BENCH`` line of ``loadtest.bench.NAME ARGS`` (which must exit 0)."""
    env, cwd = bl.child_env()
    out = subprocess.run(
        [sys.executable, "-m", f"loadtest.bench.{name}", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("BENCH ")]
    result: dict[str, Any] = json.loads(line[6:])
    return result

"""Whether a process outlives its parent's crash: a ``-c`` script that starts a child in a session of
its own and prints its pid is SIGKILLed (no teardown of its own runs), and the child must follow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from harness.processes import running


def child_outlives_a_killed_parent(script: str, env: dict[str, str] | None = None, cwd: str | None = None) -> bool:
    """Run ``script`` (it prints its child's pid), SIGKILL it, and say whether the child is still
    running 10 s later. The child is killed either way."""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert os.getsid(child) == child != os.getsid(0) and running(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        return running(child)
    finally:
        parent.kill()
        if running(child):
            os.kill(child, signal.SIGKILL)

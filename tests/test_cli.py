"""The command line's shape: --version, serve --help with the upstream flags first and the tuning knobs
under headings after them, sim --help without the proxy's knobs."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys


def run(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "watchcache", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_version() -> None:
    assert run("--version").strip() == f"watchcache {importlib.metadata.version('watchcache')}"


def headings(text: str) -> list[str]:
    return [line.split(" (")[0].rstrip(":") for line in text.splitlines() if re.match(r"^[a-z][^ ].*:$", line)]


def test_serve_help_puts_the_upstream_first_and_the_knobs_under_headings() -> None:
    text = run("serve", "--help")
    assert headings(text) == [
        "options",
        "upstream: the apiserver to cache",
        "serving",
        "authentication and authorization of cached reads",
        "pass-through of client-certificate users",
        "tuning: cache and reads",
        "tuning: watch delivery",
        "tuning: limits per worker",
        "tuning: exec, attach, cp, port-forward tunnels",
        "tuning: history older than the cache's window",
        "simulated cluster",
    ]
    upstream = text.index("upstream: the apiserver to cache")
    for flag in ("--kubeconfig", "--context", "--in-cluster", "--upstream URL", "--simulated", "--resources"):
        assert upstream < text.index(f"  {flag}") < text.index("\nserving:"), flag
    assert text.index("--max-requests-inflight") > text.index("tuning: limits per worker")


def test_sim_help_has_no_proxy_knobs() -> None:
    text = run("sim", "--help")
    for flag in ("--consistent-passthrough-objects", "--stall-timeout", "--client-cert-passthrough", "--upstream",
                 "--kubeconfig", "--tunnel-idle-timeout"):  # fmt: skip
        assert flag not in text, flag
    assert "--client-cert-passthrough" not in text and "--objects" in text

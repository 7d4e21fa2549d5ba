"""A typed-client-shaped paginated LIST of pods in protobuf, through the proxy and direct, in one run (issue 30).

Needs the reference kube-apiserver (``KUBE_REFERENCE_*``, shared/tools/kube-reference). It creates
``--pods`` realistic pods (``protobuf_cache.realistic_pod``), starts ``watchcache serve`` in front of
the apiserver (TLS, one worker, ``--authentication none``), waits for its protobuf cache of pods,
then lists all pods ``--rounds`` times per target, pages of 500, as client-go's reflector does,
over one keep-alive TLS connection per target:

- ``direct``: kube-apiserver, ``Accept: application/vnd.kubernetes.protobuf, */*``;
- ``proxy``: the proxy, the same Accept (protobuf from its protobuf cache);
- ``proxy-json``: the proxy, ``Accept: application/json`` (what a typed client got before).

The client's decode is the closest honest stand-in for client-go in Python: protobuf with the
protobuf runtime (upb) into messages of our ``meta.proto`` (each item's ObjectMeta decoded, its spec
and status kept as the message's unknown fields), JSON with ``orjson`` (everything decoded); each
item's name and resourceVersion read. Reported per pod: the client's CPU (TLS, HTTP, decode), the
bytes received, and the CPU of the proxy process and of kube-apiserver during the target's LISTs
(the apiserver is shared: other processes' requests to it are counted too).

Run: ``.venv/bin/python -m loadtest.bench.typed_list [--pods 1000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from loadtest.bench.lib import Proc, cpu_seconds, machine_info, make_tls_cert, start_process, wait_ready, watchcache_exe
from loadtest.bench.negotiation import Kube
from loadtest.bench.protobuf_cache import realistic_pod
from watchcache.kubeproto import meta_pb2

PB = "application/vnd.kubernetes.protobuf"
TYPED = PB + ", */*"
NS = f"typed-list-bench-{int(time.time())}"


def make_pods(count: int) -> None:
    kube = Kube()
    kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    kube.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "default"}})
    for i in range(count):
        kube.call("POST", f"/api/v1/namespaces/{NS}/pods", realistic_pod(i))


def cleanup() -> None:
    kube = Kube()
    kube.call("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    kube.call("DELETE", f"/api/v1/namespaces/{NS}")
    kube.call("PUT", f"/api/v1/namespaces/{NS}/finalize", {"metadata": {"name": NS}, "spec": {"finalizers": []}})


class Client:
    """One keep-alive TLS connection, as a client-go transport's."""

    def __init__(self, url: str, ctx: ssl.SSLContext, token: str | None) -> None:
        host, port = url.removeprefix("https://").rsplit(":", 1)
        self.conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str, accept: str) -> tuple[str, bytes]:
        self.conn.request("GET", path, headers={**self.headers, "Accept": accept})
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {body[:200]!r}")
        return resp.getheader("Content-Type") or "", body


def list_all(client: Client, accept: str) -> tuple[int, int, str, float]:
    """One paginated LIST of the namespace's pods, decoded: (pods, bytes, content type, CPU seconds decoding)."""
    token = ""
    pods = nbytes = 0
    content_type = ""
    decoding = 0.0
    while True:
        path = f"/api/v1/namespaces/{NS}/pods?limit=500" + (f"&continue={quote(token)}" if token else "")
        content_type, body = client.get(path, accept)
        nbytes += len(body)
        started = time.process_time()
        if content_type == PB:
            unknown = meta_pb2.Unknown.FromString(body[4:])
            page = meta_pb2.PartialObjectMetadataList.FromString(unknown.raw)
            for item in page.items:
                _ = item.metadata.name, item.metadata.resourceVersion
            pods += len(page.items)
            token = getattr(page.metadata, "continue")
        else:
            doc = orjson.loads(body)
            for item in doc["items"]:
                _ = item["metadata"]["name"], item["metadata"]["resourceVersion"]
            pods += len(doc["items"])
            token = doc["metadata"].get("continue", "")
        decoding += time.process_time() - started
        if not token:
            return pods, nbytes, content_type, decoding


def apiserver_pid() -> int:
    home = Path(os.environ.get("KUBE_REFERENCE_HOME", Path.home() / ".cache/kube-reference"))
    return int((home / "run" / "kube-apiserver.pid").read_text())


def start_proxy(workdir: Path) -> Proc:
    cert, key = make_tls_cert(workdir)
    cmd = [
        *watchcache_exe(), "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"],
        "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
        "--authentication", "none", "--workers", "1", "--resources", "pods",
    ]  # fmt: skip
    proc = start_process("proxy", cmd)
    wait_ready(proc, 120)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("KUBE_REFERENCE_URL"):
        sys.exit('needs the reference kube-apiserver: eval "$(../shared/tools/kube-reference/env.sh)"')
    proxy = None
    try:
        make_pods(args.pods)
        proxy = start_proxy(Path(tempfile.mkdtemp(prefix="typed-list-")))
        kube_ctx = ssl.create_default_context(cafile=os.environ["KUBE_REFERENCE_CA"])
        proxy_ctx = ssl.create_default_context()
        proxy_ctx.check_hostname = False
        proxy_ctx.verify_mode = ssl.CERT_NONE
        token = os.environ["KUBE_REFERENCE_TOKEN"]
        clients = {
            "direct": (Client(os.environ["KUBE_REFERENCE_URL"], kube_ctx, token), TYPED),
            "proxy": (Client(proxy.url, proxy_ctx, token), TYPED),
            "proxy-json": (Client(proxy.url, proxy_ctx, token), "application/json"),
        }
        deadline = time.monotonic() + 60
        while list_all(clients["proxy"][0], TYPED)[2] != PB:  # the proxy's protobuf cache of pods
            if time.monotonic() > deadline:
                sys.exit("the proxy's protobuf cache of pods did not get ready")
            time.sleep(0.5)
        totals: dict[str, dict[str, Any]] = {
            name: {"client": 0.0, "decode": 0.0, "proxy": 0.0, "apiserver": 0.0, "pods": 0, "bytes": 0}
            for name in clients
        }
        api_pid = apiserver_pid()
        for _ in range(args.rounds):
            for name, (client, accept) in clients.items():
                c0, p0, a0 = time.process_time(), cpu_seconds(proxy.pid), cpu_seconds(api_pid)
                pods, nbytes, content_type, decoding = list_all(client, accept)
                t = totals[name]
                t["decode"] += decoding
                t["client"] += time.process_time() - c0
                t["proxy"] += cpu_seconds(proxy.pid) - p0
                t["apiserver"] += cpu_seconds(api_pid) - a0
                t["pods"] += pods
                t["bytes"] += nbytes
                t["content_type"] = content_type
        out: dict[str, Any] = {"machine": machine_info(), "pods": args.pods, "rounds": args.rounds, "targets": {}}
        for name, t in totals.items():
            n = t["pods"]
            out["targets"][name] = {
                "content_type": t["content_type"],
                "client_us_per_pod": round(t["client"] / n * 1e6, 1),
                "client_decode_us_per_pod": round(t["decode"] / n * 1e6, 1),
                "bytes_per_pod": round(t["bytes"] / n),
                "proxy_us_per_pod": round(t["proxy"] / n * 1e6, 1),
                "apiserver_us_per_pod": round(t["apiserver"] / n * 1e6, 1),
                "client_plus_servers_us_per_pod": round((t["client"] + t["proxy"] + t["apiserver"]) / n * 1e6, 1),
            }
        print(json.dumps(out, indent=2))
    finally:
        if proxy is not None:
            proxy.stop()
        cleanup()


if __name__ == "__main__":
    main()

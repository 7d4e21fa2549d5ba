"""A real client-go typed client listing and watching pods through the proxy and direct, in one run (issue 30).

The client is ``typedgo/main.go``: client-go's typed clientset, its rest.Config set up as kube's
components set theirs (``ContentType: application/vnd.kubernetes.protobuf``, no
AcceptContentTypes: it sends ``Accept: application/vnd.kubernetes.protobuf, */*`` and decodes
whatever the server chose, into typed ``v1.Pod`` objects). It is built here from the
kube-reference kit's own tree (its vendored client-go, its Go toolchain, no network: ``go build
-mod=vendor`` with an overlay, so nothing is written into the kit's sources), once per change.

Needs the reference kube-apiserver (``eval "$(../shared/tools/kube-reference/env.sh)"``). It
creates ``--pods`` realistic pods (``protobuf_cache.realistic_pod``, ~5 KB each in protobuf) in a
namespace of its own, starts ``watchcache serve`` in front of the apiserver as deployed (TLS,
delegated authentication, one worker, pods cached), waits for its protobuf cache of pods, then
per repetition and target (direct to kube-apiserver, through the proxy, and through the proxy with
``ContentType: application/json``, what the proxy's answer was for every typed client before it
served protobuf; interleaved):

- LIST: ``--rounds`` full paginated LISTs (``limit=500``, ``resourceVersion=0`` as a reflector's
  first page), over one client (one keep-alive TLS connection, HTTP/2 as client-go negotiates it);
- WATCH: ``--watches`` watches from ``resourceVersion=0``, each read until its initial ADDED
  events for every pod came (decoded to typed pods, as an informer's watch).

Reported per object (pod listed, event watched): the client's CPU (the Go process's rusage: TLS,
HTTP, decode), the bytes it received (response bodies), the content type it got, and the CPU of
the proxy and of kube-apiserver during that phase (``/proc``; the apiserver is shared with
whatever else runs on the machine), with the load average. And the goals' ratios.

Run: ``.venv/bin/python -m loadtest.bench.typed_go [--pods 2000] [--rounds 5] [--watches 5] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.bench import typed_list
from loadtest.bench.lib import Proc, cpu_seconds, machine_info, make_tls_cert, start_process, wait_ready, watchcache_exe

MAIN = Path(__file__).parent / "typedgo" / "main.go"
PACKAGE = "cmd/wc-typedgo"  # where the overlay puts main.go in the kit's module


def kit_home() -> Path:
    return Path(os.environ.get("KUBE_REFERENCE_HOME", Path.home() / ".cache/kube-reference"))


def build_client(out_dir: Path) -> Path:
    """``typedgo`` built from the kit's vendored tree (offline), reused while main.go is unchanged."""
    home = kit_home()
    goroot = next((home / "gotool").glob("lib/python*/site-packages/go"), None)
    if goroot is None or not (home / "src" / "vendor" / "k8s.io" / "client-go").is_dir():
        sys.exit(f"no Go toolchain or vendored client-go under {home} (run the kit's build.sh)")
    digest = hashlib.sha256(MAIN.read_bytes()).hexdigest()[:16]
    binary = out_dir / f"typedgo-{digest}"
    if binary.exists():
        return binary
    overlay = out_dir / "typedgo-overlay.json"
    overlay.write_text(json.dumps({"Replace": {str(home / "src" / PACKAGE / "main.go"): str(MAIN)}}))
    env = {
        **os.environ,
        "GOROOT": str(goroot),
        "PATH": f"{goroot / 'bin'}:{os.environ['PATH']}",
        # The kit's build settings (shared/tools/kube-reference/build.sh), its build cache reused.
        "GOFLAGS": "-mod=vendor -p=1",
        "CGO_ENABLED": "0",
        "GOEXPERIMENT": "nojsonv2",
        "GOTOOLCHAIN": "local",
        "GOPROXY": "off",
        "GOCACHE": str(home / "gocache"),
        "GOPATH": str(out_dir / "gopath"),
        "GOENV": "off",
        "GOWORK": "off",
    }
    cmd = ["go", "build", "-overlay", str(overlay), "-trimpath", "-tags", "providerless,osusergo",
           "-o", str(binary), "./" + PACKAGE]  # fmt: skip
    subprocess.run(cmd, cwd=home / "src", env=env, check=True)
    return binary


def start_proxy(workdir: Path) -> tuple[Proc, Path]:
    cert, key = make_tls_cert(workdir)
    cmd = [
        *watchcache_exe(), "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"],
        "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
        "--authentication", "delegated", "--workers", "1", "--resources", "pods",
    ]  # fmt: skip
    proc = start_process("proxy", cmd)
    wait_ready(proc, 120)
    return proc, cert


def run_client(binary: Path, target: list[str], pods: int, rounds: int, watches: int) -> dict[str, Any]:
    cmd = [str(binary), "--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"], "--namespace", typed_list.NS,
           "--rounds", str(rounds), "--watches", str(watches), "--expect", str(pods), *target]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"typedgo {target}: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def goals(direct: dict[str, Any], proxy: dict[str, Any]) -> dict[str, float]:
    """Issue 30's goals as ratios, through the proxy over direct."""
    client, nbytes = "client_us_per_object", "bytes_per_object"
    return {
        "client_cpu_proxy_over_direct (goal <= 1.1)": round(proxy[client] / direct[client], 2),
        "bytes_proxy_over_direct (goal 1.0)": round(proxy[nbytes] / direct[nbytes], 3),
        "client_plus_proxy_over_client_plus_apiserver_direct (goal < 1)": round(
            (proxy[client] + proxy["proxy_us_per_object"]) / (direct[client] + direct["apiserver_us_per_object"]), 2
        ),
        "cluster_proxy_over_direct": round(proxy["cluster_us_per_object"] / direct["cluster_us_per_object"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="full paginated LISTs per repetition")
    parser.add_argument("--watches", type=int, default=5, help="watches from resourceVersion=0 per repetition")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions per target, interleaved")
    args = parser.parse_args()
    if not os.environ.get("KUBE_REFERENCE_URL"):
        sys.exit('needs the reference kube-apiserver: eval "$(../shared/tools/kube-reference/env.sh)"')
    typed_list.NS = f"proto2-typed-go-{int(time.time())}"
    workdir = Path(tempfile.mkdtemp(prefix="typed-go-"))
    binary = build_client(Path(tempfile.gettempdir()))
    proxy = None
    try:
        typed_list.make_pods(args.pods)
        proxy, cert = start_proxy(workdir)
        via_proxy = ["--server", proxy.url, "--ca", str(cert)]
        targets = {"direct": [], "proxy": via_proxy, "proxy-json": [*via_proxy, "--json"]}
        deadline = time.monotonic() + 60
        while run_client(binary, targets["proxy"], args.pods, 1, 0)["list"]["content_type"] != typed_list.PB:
            if time.monotonic() > deadline:
                sys.exit("the proxy's protobuf cache of pods did not get ready")
            time.sleep(0.5)
        api_pid = typed_list.apiserver_pid()
        phases = ("list", "watch")
        totals = {t: {p: dict.fromkeys(("client", "proxy", "apiserver", "objects", "bytes"), 0.0) for p in phases}
                  for t in targets}  # fmt: skip
        seen: dict[str, dict[str, Any]] = {
            t: {p: {"content_types": set(), "load": []} for p in phases} for t in targets
        }
        for _ in range(args.repeat):
            for name, target in targets.items():
                for phase in phases:
                    rounds, watches = (args.rounds, 0) if phase == "list" else (0, args.watches)
                    p0, a0 = cpu_seconds(proxy.pid), cpu_seconds(api_pid)
                    got = run_client(binary, target, args.pods, rounds, watches)[phase]
                    t = totals[name][phase]
                    t["proxy"] += cpu_seconds(proxy.pid) - p0
                    t["apiserver"] += cpu_seconds(api_pid) - a0
                    t["client"] += got["cpu_seconds"]
                    t["objects"] += got["objects"]
                    t["bytes"] += got["bytes"]
                    seen[name][phase]["content_types"].add(got["content_type"])
                    seen[name][phase]["load"].append(round(os.getloadavg()[0], 1))
        out: dict[str, Any] = {"machine": machine_info(), "pods": args.pods, "rounds": args.rounds,
                               "watches": args.watches, "repeat": args.repeat, "targets": {}, "goals": {}}  # fmt: skip
        for name in targets:
            for phase in phases:
                t, n = totals[name][phase], totals[name][phase]["objects"]
                server = t["proxy"] + t["apiserver"]
                out["targets"][f"{name} {phase}"] = {
                    "content_type": sorted(seen[name][phase]["content_types"]),
                    "objects": int(n),
                    "client_us_per_object": round(t["client"] / n * 1e6, 1),
                    "bytes_per_object": round(t["bytes"] / n),
                    "proxy_us_per_object": round(t["proxy"] / n * 1e6, 1),
                    "apiserver_us_per_object": round(t["apiserver"] / n * 1e6, 1),
                    "cluster_us_per_object": round((t["client"] + server) / n * 1e6, 1),
                    "load_average_1m": seen[name][phase]["load"],
                }
        for phase in phases:
            out["goals"][phase] = goals(out["targets"][f"direct {phase}"], out["targets"][f"proxy {phase}"])
        print(json.dumps(out, indent=2))
    finally:
        if proxy is not None:
            proxy.stop()
        typed_list.cleanup()


if __name__ == "__main__":
    main()

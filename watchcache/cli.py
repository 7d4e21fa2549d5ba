"""``watchcache`` command line: ``sim`` (the simulated cluster), ``serve`` (the proxy), ``demo`` (both)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from watchcache.auth.options import add_auth_flags, add_identity_flags, auth_options, identity_options
from watchcache.cache.store import CacheConfig
from watchcache.http.protocol import HttpLimits
from watchcache.logs import configure
from watchcache.server.context import ServeConfig
from watchcache.server.tunnel import TunnelLimits
from watchcache.service.lifecycle import RunOptions, ShardOptions, SimOptions, parse_listen, run
from watchcache.shard.supervisor import Supervisor
from watchcache.upstream.config import UpstreamConfigError, from_flags, from_kubeconfig, in_cluster
from watchcache.upstream.reflector import ReflectorConfig

_CACHE = CacheConfig()
_HTTP = HttpLimits()
_SERVE = ServeConfig()
_REFLECTOR = ReflectorConfig()
_TUNNELS = TunnelLimits()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to serve the Kubernetes API on (default %(default)s; port 0 picks a free one)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default %(default)s"
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text, or JSON lines for log pipelines (default %(default)s)",
    )
    p.add_argument(
        "--history-max-events",
        type=int,
        default=_CACHE.history_max_events,
        help="events kept per resource for watch resumption and exact reads (default %(default)s)",
    )
    p.add_argument(
        "--history-max-age",
        type=float,
        default=_CACHE.history_max_age,
        help="seconds of history kept per resource (default %(default)s, etcd's compaction interval)",
    )
    p.add_argument(
        "--bookmark-interval",
        type=float,
        default=_SERVE.bookmark_interval,
        help="seconds between BOOKMARK events for watchers that allow them (default %(default)s)",
    )
    p.add_argument(
        "--fresh-wait",
        type=float,
        default=_SERVE.fresh_wait,
        help="seconds a read waits for a resourceVersion (or for a consistent-read proof) before 504 or "
        "pass-through (default %(default)s)",
    )
    p.add_argument(
        "--min-request-timeout",
        type=float,
        default=_SERVE.min_request_timeout,
        help="watches without timeoutSeconds end after [N, 2N) seconds (default %(default)s)",
    )
    p.add_argument(
        "--max-limit", type=int, default=0, help="clamp LIST page sizes to this many items (default: no clamp)"
    )
    p.add_argument(
        "--max-watch-buffer-bytes",
        type=int,
        default=_SERVE.watch_max_pending_bytes,
        help="unsent event bytes per watcher before it is treated as slow: its buffer is dropped and it is "
        "caught up from history once it reads again, or ended with 410 if history moved on (default %(default)s)",
    )
    p.add_argument(
        "--watch-flush-interval",
        type=float,
        default=_SERVE.watch_flush_interval,
        help="write watch streams at most once per this many seconds: events closer together share one "
        "write per watcher, at up to this much added latency (0: write on every loop pass; default %(default)s)",
    )
    p.add_argument(
        "--delivery-sample",
        type=int,
        default=_SERVE.delivery_sample,
        help="observe watch delivery latency on one flush in N (0: never; the only per-flush metric cost) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-requests-inflight",
        type=int,
        default=_SERVE.max_requests_inflight,
        help="non-watch requests handled at once per worker; more get 429 with Retry-After (default %(default)s)",
    )
    p.add_argument(
        "--max-watchers",
        type=int,
        default=_SERVE.max_watchers,
        help="watches open at once per worker; more get 429 with Retry-After (default %(default)s)",
    )
    p.add_argument(
        "--max-header-bytes",
        type=int,
        default=_HTTP.max_header_bytes,
        help="request line and headers larger than this get 431 (default %(default)s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=_HTTP.max_body_bytes,
        help="request bodies larger than this get 413 (default %(default)s, kube-apiserver's limit)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=_HTTP.header_timeout,
        help="seconds a client has to send a complete request head (slowloris defence) (default %(default)s)",
    )
    p.add_argument(
        "--keepalive-timeout",
        type=float,
        default=_HTTP.keepalive_timeout,
        help="seconds an idle keep-alive connection is kept (default %(default)s)",
    )
    p.add_argument(
        "--tls-cert-file",
        help="serve HTTPS with this certificate (PEM; reloaded when it changes). Needed in front of a real cluster: "
        "kubectl and client-go send no bearer token or client certificate to an http:// server",
    )
    p.add_argument("--tls-private-key-file", help="the key of --tls-cert-file")
    p.add_argument(
        "--client-ca-file",
        help="accept client certificates signed by this CA (user = CN, groups = O), as kube-apiserver does; "
        "their pass-through requests need --client-cert-passthrough (else 403)",
    )
    p.add_argument(
        "--continue-token-key-file",
        type=Path,
        help="file with the key that signs continue tokens; share it between replicas (default: random per process)",
    )


def _sim_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument(f"--{prefix}objects", type=int, default=0, help="pods to create at start (default %(default)s)")
    p.add_argument(
        f"--{prefix}namespaces",
        type=int,
        default=1,
        help="namespaces ns-0..ns-N-1 to spread them over (default %(default)s)",
    )
    p.add_argument(f"--{prefix}nodes", type=int, default=10, help="nodes to schedule pods on (default %(default)s)")
    p.add_argument(
        f"--{prefix}churn",
        type=float,
        default=0.0,
        metavar="EVENTS_PER_S",
        help="writes per second: pod updates, creates and deletes (default %(default)s)",
    )
    p.add_argument(
        f"--{prefix}seed", type=int, default=0, help="random seed for generated objects (default %(default)s)"
    )
    p.add_argument(
        f"--{prefix}policy-file",
        default=None,
        help="users, tokens and RBAC-like rules (YAML; see watchcache/sim/policy-example.yaml): the simulated "
        "cluster answers TokenReview/SubjectAccessReview and enforces them (default: no authentication)",
    )
    p.add_argument(
        f"--{prefix}state-file",
        default=None,
        help="journal every commit to this file and replay it at start, so the cluster survives restarts "
        "(default: in memory only)",
    )


def _upstream_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("upstream (a kube-apiserver; none: an embedded simulated cluster)")
    g.add_argument("--kubeconfig", help="kubeconfig file for the upstream")
    g.add_argument("--context", help="kubeconfig context (default: current-context)")
    g.add_argument(
        "--in-cluster", action="store_true", help="use the pod's service account and KUBERNETES_SERVICE_HOST"
    )
    g.add_argument("--upstream", metavar="URL", help="upstream apiserver URL, e.g. https://10.0.0.1:6443")
    g.add_argument("--token-file", help="bearer token file for --upstream (re-read as it rotates)")
    g.add_argument("--client-certificate", help="client certificate file for --upstream")
    g.add_argument("--client-key", help="client key file for --upstream")
    g.add_argument("--certificate-authority", help="CA bundle to verify the upstream's certificate")
    g.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not verify the upstream's certificate (never in production)",
    )
    g.add_argument(
        "--resources",
        default="",
        help="comma-separated resources to cache, e.g. pods,configmaps,apps/v1/deployments "
        "(default: pods, nodes, namespaces, services, configmaps, serviceaccounts, endpoints, apps workloads, "
        "endpointslices; the embedded cluster: all it has)",
    )
    add_auth_flags(g)
    add_identity_flags(g)
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes sharing the port, each owning part of the cache (default: the CPUs the "
        "container may use, from its cgroup CPU limit; 1 without an upstream flag)",
    )
    g.add_argument("--worker-id", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--shard-dir", default=None, help=argparse.SUPPRESS)
    g.add_argument(
        "--stall-timeout",
        type=float,
        default=_REFLECTOR.stall_timeout,
        help="seconds of silence (no event, no bookmark) after which an upstream watch is re-established "
        "(default %(default)s)",
    )
    g.add_argument(
        "--tunnel-idle-timeout",
        type=float,
        default=_TUNNELS.idle_timeout,
        help="seconds without a byte either way after which an exec/attach/port-forward tunnel is closed "
        "(default %(default)s: 4 h, the kubelet's --streaming-connection-idle-timeout)",
    )
    g.add_argument(
        "--tunnel-max-duration",
        type=float,
        default=_TUNNELS.max_duration,
        help="seconds after which a tunnel is closed whatever it does (default %(default)s: 24 h)",
    )
    g.add_argument(
        "--max-tunnels",
        type=int,
        default=_TUNNELS.max_tunnels,
        help="exec/attach/port-forward tunnels open at once per worker; more get 429 with Retry-After "
        "(default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="watchcache", description="A sharded, high-throughput watch cache for the Kubernetes API."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "sim",
        help="run the simulated Kubernetes cluster (a writable in-memory API)",
        description="A writable in-memory Kubernetes API with a churn generator, for demos, tests and load tests.",
    )
    _common(sim)
    _sim_flags(sim)
    sim.add_argument(
        "--requestheader-client-ca-file",
        metavar="FILE",
        help="believe X-Remote-User/-Group/-Extra-* headers on requests whose client certificate this CA signed "
        "(a front proxy, e.g. watchcache serve --proxy-client-cert-file), as kube-apiserver's flag of that name; "
        "needs --tls-cert-file and --policy-file",
    )
    sim.add_argument(
        "--anonymous-auth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --policy-file: requests without credentials are system:anonymous rather than 401 "
        "(default %(default)s, as kube-apiserver)",
    )
    sim.add_argument(
        "--requestheader-allowed-names",
        default="",
        metavar="CN,...",
        help="common names a front-proxy certificate may have (default: any the CA signed)",
    )
    serve = sub.add_parser(
        "serve",
        help="run the watch cache",
        description=(
            "Serve GET/LIST/WATCH from a revisioned in-memory cache fed by one list+watch per resource; "
            "everything else passes through to the upstream. With no upstream flag, an embedded simulated "
            "cluster is the upstream (the --sim-* flags shape it)."
        ),
    )
    _common(serve)
    _upstream_flags(serve)
    _sim_flags(serve, "sim-")
    demo = sub.add_parser(
        "demo",
        help="run a simulated cluster and the watch cache in front of it (two processes)",
        description="Starts `watchcache sim` and `watchcache serve --upstream` in front of it; prints the URL "
        "and a kubectl line to try.",
    )
    demo.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="the proxy's address (default %(default)s)"
    )
    demo.add_argument(
        "--sim-listen",
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="the simulated cluster's (default %(default)s)",
    )
    demo.add_argument("--objects", type=int, default=1000, help="pods in the simulated cluster (default %(default)s)")
    demo.add_argument("--namespaces", type=int, default=10, help="namespaces (default %(default)s)")
    demo.add_argument("--churn", type=float, default=5.0, help="writes per second (default %(default)s)")
    return parser


def _upstream(args: argparse.Namespace) -> tuple[str, object]:
    if args.kubeconfig:
        return "proxy", from_kubeconfig(args.kubeconfig, args.context)
    if args.in_cluster:
        return "proxy", in_cluster()
    if args.upstream:
        return "proxy", from_flags(
            args.upstream,
            token_file=args.token_file,
            client_certificate=args.client_certificate,
            client_key=args.client_key,
            certificate_authority=args.certificate_authority,
            insecure_skip_tls_verify=args.insecure_skip_tls_verify,
        )
    return "embedded", None


def options_from(args: argparse.Namespace, prefix: str, upstream: object = None) -> RunOptions:
    host, port = parse_listen(args.listen)
    g = vars(args)
    key = args.continue_token_key_file.read_bytes().strip() if args.continue_token_key_file else b""
    return RunOptions(
        host=host,
        port=port,
        serve=ServeConfig(
            fresh_wait=args.fresh_wait,
            bookmark_interval=args.bookmark_interval,
            min_request_timeout=args.min_request_timeout,
            max_limit=args.max_limit,
            watch_max_pending_bytes=args.max_watch_buffer_bytes,
            max_requests_inflight=args.max_requests_inflight,
            delivery_sample=args.delivery_sample,
            watch_flush_interval=args.watch_flush_interval,
            max_watchers=args.max_watchers,
        ),
        http=HttpLimits(
            max_header_bytes=args.max_header_bytes,
            max_body_bytes=args.max_body_bytes,
            header_timeout=args.header_timeout,
            keepalive_timeout=args.keepalive_timeout,
        ),
        tls=_tls(args),
        cache=CacheConfig(history_max_events=args.history_max_events, history_max_age=args.history_max_age),
        sim=SimOptions(
            objects=g[f"{prefix}objects"],
            namespaces=g[f"{prefix}namespaces"],
            nodes=g[f"{prefix}nodes"],
            churn=g[f"{prefix}churn"],
            seed=g[f"{prefix}seed"],
            state_file=g[f"{prefix}state_file"],
            policy_file=g[f"{prefix}policy_file"],
            anonymous=g.get("anonymous_auth", True) if args.command == "sim" else True,
            requestheader_ca_file=g.get("requestheader_client_ca_file"),
            requestheader_allowed_names=tuple(
                n.strip() for n in g.get("requestheader_allowed_names", "").split(",") if n.strip()
            ),
        ),
        resources=tuple(r.strip() for r in g.get("resources", "").split(",") if r.strip()),
        continue_key=key,
        upstream=upstream,  # type: ignore[arg-type]
        reflector=ReflectorConfig(stall_timeout=g.get("stall_timeout", _REFLECTOR.stall_timeout)),
        tunnels=TunnelLimits(
            idle_timeout=g.get("tunnel_idle_timeout", _TUNNELS.idle_timeout),
            max_duration=g.get("tunnel_max_duration", _TUNNELS.max_duration),
            max_tunnels=g.get("max_tunnels", _TUNNELS.max_tunnels),
        ),
        auth=auth_options(args, upstream_is_tls=getattr(upstream, "is_tls", False)) if "authentication" in g else None,
        identity=identity_options(args) if "client_cert_passthrough" in g else None,
    )


def effective_cpus() -> int:
    """CPUs this process may use: the cgroup CPU limit (a container's), else its affinity mask."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            return max(1, round(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def _tls(args: argparse.Namespace) -> tuple[str, str, str | None] | None:
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise ValueError("--tls-cert-file and --tls-private-key-file go together")
    if args.client_ca_file and not args.tls_cert_file:
        raise ValueError("--client-ca-file needs --tls-cert-file")
    return (args.tls_cert_file, args.tls_private_key_file, args.client_ca_file) if args.tls_cert_file else None


def _without(argv: list[str], flags: set[str]) -> list[str]:
    """``argv`` minus the given ``--flag value`` / ``--flag=value`` options (the supervisor sets them per worker)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"), getattr(args, "worker_id", None))
    try:
        if args.command == "demo":
            from watchcache.demo import run_demo

            return run_demo(args)
        if args.command == "sim":
            run(options_from(args, ""), "sim")
        else:
            mode, upstream = _upstream(args)
            workers = args.workers if args.workers is not None else effective_cpus() if mode == "proxy" else 1
            if workers < 1:
                raise ValueError("--workers must be at least 1")
            if workers > 1 and mode != "proxy":
                raise ValueError("--workers > 1 needs an upstream (--upstream, --kubeconfig or --in-cluster)")
            if workers > 1 and args.worker_id is None:
                host, port = parse_listen(args.listen)
                raw = list(sys.argv[2:] if argv is None else argv[1:])
                worker_args = _without(raw, {"--listen", "--workers", "--continue-token-key-file"})
                key = str(args.continue_token_key_file) if args.continue_token_key_file else None
                return Supervisor(worker_args, workers, host, port, continue_key_file=key).run()
            options = options_from(args, "sim_", upstream)
            if args.worker_id is not None:
                options = dataclasses.replace(options, shard=ShardOptions(args.worker_id, workers, args.shard_dir))
            run(options, mode)
    except (ValueError, UpstreamConfigError, OSError) as e:
        print(f"watchcache: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

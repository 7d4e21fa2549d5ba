"""``watchcache`` command line: ``sim`` (the simulated cluster) and ``serve`` (the proxy)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from watchcache.cache.store import CacheConfig
from watchcache.server.context import ServeConfig
from watchcache.service import RunOptions, SimOptions, parse_listen, run_serve, run_sim

_DEFAULT_CACHE = CacheConfig()
_DEFAULT_SERVE = ServeConfig()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to serve the Kubernetes API on (default %(default)s; port 0 picks one)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default %(default)s)",
    )
    p.add_argument(
        "--history-max-events",
        type=int,
        default=_DEFAULT_CACHE.history_max_events,
        help="events kept per resource for watch resumption and exact reads (default %(default)s)",
    )
    p.add_argument(
        "--history-max-age",
        type=float,
        default=_DEFAULT_CACHE.history_max_age,
        help="seconds of history kept per resource (default %(default)s, etcd's compaction interval)",
    )
    p.add_argument(
        "--bookmark-interval",
        type=float,
        default=_DEFAULT_SERVE.bookmark_interval,
        help="seconds between BOOKMARK events for watchers that allow them (default %(default)s)",
    )
    p.add_argument(
        "--fresh-wait",
        type=float,
        default=_DEFAULT_SERVE.fresh_wait,
        help="seconds a read waits for a future resourceVersion before 504 (default %(default)s)",
    )
    p.add_argument(
        "--min-request-timeout",
        type=float,
        default=_DEFAULT_SERVE.min_request_timeout,
        help="watches without timeoutSeconds end after [N, 2N) seconds (default %(default)s)",
    )
    p.add_argument(
        "--max-limit", type=int, default=0, help="clamp LIST page sizes to this many items (default: no clamp)"
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
        help="writes per second (pod updates, creates, deletes) (default %(default)s)",
    )
    p.add_argument(
        f"--{prefix}seed", type=int, default=0, help="random seed for generated objects (default %(default)s)"
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
    serve = sub.add_parser(
        "serve",
        help="run the watch cache",
        description=(
            "Serve GET/LIST/WATCH from a revisioned in-memory cache; everything else goes to the upstream. "
            "Until an upstream is configured, an embedded simulated cluster is the upstream."
        ),
    )
    _common(serve)
    serve.add_argument(
        "--resources",
        default="",
        help="comma-separated resources to cache, e.g. pods,configmaps,apps/v1/deployments (default: all known)",
    )
    _sim_flags(serve, "sim-")
    return parser


def options_from(args: argparse.Namespace, prefix: str) -> RunOptions:
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
        ),
        cache=CacheConfig(history_max_events=args.history_max_events, history_max_age=args.history_max_age),
        sim=SimOptions(
            objects=g[f"{prefix}objects"],
            namespaces=g[f"{prefix}namespaces"],
            nodes=g[f"{prefix}nodes"],
            churn=g[f"{prefix}churn"],
            seed=g[f"{prefix}seed"],
        ),
        resources=tuple(r for r in getattr(args, "resources", "").split(",") if r),
        continue_key=key,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        if args.command == "sim":
            run_sim(options_from(args, ""))
        else:
            run_serve(options_from(args, "sim_"))
    except ValueError as e:
        print(f"watchcache: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``watchcache`` command line: ``sim`` (the simulated cluster), ``serve`` (the proxy), ``demo`` (both).

The flags and their help are ``flags.py``; this module runs the subcommand they name.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys

from watchcache.argtypes import parse_listen
from watchcache.flags import build_parser, upstream_flags
from watchcache.http.listener import bind_listener, inherited_listener
from watchcache.logs import configure
from watchcache.service.openfiles import raise_open_files_limit
from watchcache.service.options import RunOptions, worker_count
from watchcache.service.proxy import run_proxy
from watchcache.shard.supervisor import Supervisor
from watchcache.sim.options import SimOptions
from watchcache.upstream.config import UpstreamConfigError
from watchcache.upstream.kubeconfig import upstream_from_flags


def _listener(args: argparse.Namespace) -> socket.socket:
    """The public socket: handed down (a worker, or a part of ``watchcache demo``), else bound now, before
    anything starts, so that an address this process cannot own fails the start."""
    if args.listen_fd is not None:
        return inherited_listener(args.listen_fd)
    return bind_listener(*parse_listen(args.listen))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"), getattr(args, "worker_id", None))
    raise_open_files_limit()  # every command serves; as Go programs (kube-apiserver) do: service/openfiles.py
    # The cache holds the cluster's objects (Secrets with --authentication delegated): a crash must
    # not write them to a core file (docs/security.md, "Secrets in memory").
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        if args.command == "demo":
            from watchcache.demo import run_demo

            return run_demo(args)
        if args.command == "sim":
            from watchcache.sim.wiring import run_sim

            options, sim = RunOptions.from_args(args), SimOptions.from_args(args)
            run_sim(options, sim, _listener(args))
            return 0
        raw = sys.argv[1:] if argv is None else argv
        sim_flags = sorted({a.split("=", 1)[0] for a in raw if a.startswith("--sim-")})
        if sim_flags and not args.simulated:
            raise ValueError(f"{', '.join(sim_flags)} shape the simulated cluster: add --simulated to run one")
        upstream = upstream_from_flags(upstream_flags(args))
        if upstream is not None:
            upstream.check()
        workers = worker_count(args.workers, upstream is not None)
        # Every check of the options, before a worker starts: a mistake is said once, by the supervisor.
        options = RunOptions.from_args(args, upstream, workers)
        if workers > 1 and args.worker_id is None:
            serve_args = list(sys.argv[2:] if argv is None else argv[1:])
            key = str(args.continue_token_key_file) if args.continue_token_key_file else None
            # A worker's drain: in-flight reads (up to --fresh-wait + 1 s), then its connections close.
            drain = max(10.0, args.fresh_wait + 5.0)
            inherited = inherited_listener(args.listen_fd) if args.listen_fd is not None else None
            return Supervisor(
                serve_args,
                workers,
                options.host,
                options.port,
                continue_key_file=key,
                drain_timeout=drain,
                run_worker=main,
                listener=inherited,
            ).run()
        listener = _listener(args)
        if upstream is None:
            from watchcache.sim.wiring import run_embedded

            run_embedded(options, SimOptions.from_args(args, "sim_"), listener)
        else:
            run_proxy(options, listener)
    except (ValueError, UpstreamConfigError, OSError) as e:
        print(f"watchcache: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

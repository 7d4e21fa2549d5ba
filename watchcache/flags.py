"""The command line's flags: every subcommand's, their defaults (taken from the config objects that
own them, so help and behaviour cannot disagree) and their help text; ``cli.py`` runs what they name."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from watchcache.argtypes import Count, Number, listen_address
from watchcache.auth.options import add_auth_flags
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.backfill import BackfillLimits
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.server.config import ServeConfig
from watchcache.server.tunnel import TunnelLimits
from watchcache.service.options import CachingOptions
from watchcache.sim.options import SimOptions
from watchcache.upstream.discovery import ResourceResolutionError, parse_resource_id
from watchcache.upstream.identity_options import add_identity_flags
from watchcache.upstream.kubeconfig import UpstreamFlags
from watchcache.upstream.reflector import ReflectorConfig
from watchcache.version import version

_CACHE = CacheConfig()
_HTTP = HttpLimits()
_H2 = H2Limits()
_SERVE = ServeConfig()
_REFLECTOR = ReflectorConfig()
_SIM = SimOptions()
_TUNNELS = TunnelLimits()
_CACHING = CachingOptions()
_BACKFILL = BackfillLimits()

# Each flag's range (watchcache.argtypes): 0 is allowed where it has a meaning its help names ("0: no limit").
_AT_LEAST_0 = Count(0)
_AT_LEAST_1 = Count(1)
_NOT_NEGATIVE = Number()
_POSITIVE = Number(positive=True)
# HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS is a 31-bit value (RFC 9113, 6.5.2).
_MAX_HTTP2_STREAMS = 2**31 - 1


# argparse names no public type for what add_argument_group returns.
Group = argparse.ArgumentParser | argparse._ArgumentGroup  # noqa: SLF001


def _flag(p: Group, name: str, kind: Callable[[str], object], default: object, text: str) -> None:
    """A flag of type ``kind`` (its range, checked as the command line is parsed) whose shown default is its
    option object's default."""
    p.add_argument(name, type=kind, default=default, help=f"{text} (default %(default)s)")


# One flag per statement, its help wrapped by hand: a table of flags reads better than one argument a line.
# fmt: off
def _serving(g: Group, *, proxy: bool) -> None:
    g.add_argument("--listen", type=listen_address, default="127.0.0.1:8080", metavar="HOST:PORT", help="address to "
                   "serve the Kubernetes API on (default %(default)s; port 0 picks a free one)")
    g.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM; reloaded when it changes). "
                   "Needed in front of a real cluster: kubectl and client-go send no bearer token or client "
                   "certificate to an http:// server")
    g.add_argument("--tls-private-key-file", help="the key of --tls-cert-file")
    g.add_argument("--client-ca-file", help="accept client certificates signed by this CA (user = CN, groups = O), "
                   "as kube-apiserver does" + ("; their pass-through requests need --client-cert-passthrough (else "
                   "403)" if proxy else ""))
    g.add_argument("--http2", action="store_true", help="offer HTTP/2 (ALPN h2) as well as HTTP/1.1 on the TLS "
                   "listener, as kube-apiserver does: a client-go process then multiplexes its watches on one "
                   "connection (needs --tls-cert-file; docs/deploy.md says when to turn it on; default off)")
    # The listening socket, open at this descriptor (a supervisor's workers, watchcache demo's parts).
    g.add_argument("--listen-fd", type=_AT_LEAST_0, help=argparse.SUPPRESS)
    g.add_argument("--continue-token-key-file", type=Path, help="file with the key that signs continue tokens; share "
                   "it between replicas (default: random per process)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="default %(default)s")
    g.add_argument("--log-format", default="text", choices=["text", "json"], help="text, or JSON lines for log "
                   "pipelines (default %(default)s)")


def _reads(g: Group, *, proxy: bool) -> None:
    c, s = _CACHE, _SERVE
    _flag(g, "--history-max-events", _AT_LEAST_1, c.history_max_events, "events kept per resource for watch resumption "
          "and exact reads")
    g.add_argument("--history-max-age", type=_POSITIVE, default=c.history_max_age, help="seconds of history kept per "
                   "resource (default %(default)s, etcd's compaction interval)")
    _flag(g, "--bookmark-interval", _POSITIVE, s.bookmark_interval, "seconds between BOOKMARK events for watchers that "
          "allow them (kube-apiserver's interval; each is a write per watcher)")
    _flag(g, "--fresh-wait", _NOT_NEGATIVE, s.fresh_wait, "seconds a read waits for a resourceVersion (or for a "
          "consistent-read proof) before 504 or pass-through")
    if proxy:
        g.add_argument("--consistent-passthrough-objects", type=_AT_LEAST_0, default=None, help="deprecated, ignored: "
                       "a consistent GET goes to the upstream and a consistent LIST waits for its scope's proof, one "
                       "round trip (docs/consistency.md)")
    _flag(g, "--min-request-timeout", _POSITIVE, s.min_request_timeout, "watches without timeoutSeconds end after "
          "[N, 2N) seconds")
    g.add_argument("--max-limit", type=_AT_LEAST_0, default=s.max_limit, help="clamp LIST page sizes to this many "
                   "items (default: no clamp)")
    if proxy:
        _flag(g, "--stall-timeout", _POSITIVE, _REFLECTOR.stall_timeout, "seconds of silence (no event, no bookmark) "
              "after which an upstream watch is re-established")
        _flag(g, "--encoding-idle-timeout", _POSITIVE, _REFLECTOR.encoding_idle, "seconds a resource's cache in one "
              "encoding may go unread before its upstream watch stops while the other serves: a protobuf cache is "
              "dropped, a JSON feed suspended while only protobuf clients read the resource")


def _delivery(g: Group) -> None:
    s = _SERVE
    _flag(g, "--max-watch-buffer-bytes", _AT_LEAST_1, s.watch_max_pending_bytes, "unsent event bytes per watcher "
          "before it is treated as slow: its buffer is dropped and it is caught up from history once it reads again, "
          "or ended with 410 if history moved on")
    _flag(g, "--max-watch-buffer-total-bytes", _AT_LEAST_0, s.watch_max_total_bytes, "unsent event bytes of all "
          "watchers of a worker; past it the watchers furthest behind are treated as slow first, as with "
          "--max-watch-buffer-bytes (0: no limit)")
    g.add_argument("--watch-flush-interval", type=_NOT_NEGATIVE, default=s.watch_flush_interval, help="write watch "
                   "streams at most once per this many seconds: events closer together share one write per watcher, at "
                   "up to this much added latency (0: write on every loop pass; default %(default)s)")
    _flag(g, "--watch-flush-pacing", _NOT_NEGATIVE, s.watch_flush_pacing, "start a flush pass no sooner than this "
          "many times the CPU time the last pass took after it: events share writes in proportion to what writing "
          "costs, nothing after a pass that wrote to a few watches, milliseconds after a broadcast to thousands (0: no "
          "pacing)")
    _flag(g, "--watch-flush-max-delay", _NOT_NEGATIVE, s.watch_flush_max_delay, "the longest --watch-flush-pacing "
          "waits, in seconds: an event waits at most this plus two passes")
    _flag(g, "--delivery-sample", _AT_LEAST_0, s.delivery_sample, "observe watch delivery latency on one flush in N "
          "(0: never; the only per-flush metric cost)")


def _limits(g: Group) -> None:
    s, h = _SERVE, _HTTP
    _flag(g, "--max-requests-inflight", _AT_LEAST_1, s.max_requests_inflight, "requests handled at once per worker (a "
          "watch until it is registered); more get 429 with Retry-After. A request waiting (for a review, a proof of "
          "freshness, the upstream) holds no seat (with priority and fairness a flow's pass-throughs past its priority "
          "level's seats wait, seatless, for a turn at the upstream)")
    _flag(g, "--max-requests-waiting", _AT_LEAST_0, s.max_requests_waiting, "requests waiting without a seat at once "
          "per worker (for a review, a proof of freshness, the upstream); past it a waiting request keeps its seat")
    g.add_argument("--enable-priority-and-fairness", action=argparse.BooleanOptionalAction, default=True, help="API "
                   "Priority and Fairness, as kube-apiserver's: requests are classified by the upstream's FlowSchemas "
                   "(else kube's suggested ones) and wait in their flow's queue for a seat of their priority level, "
                   "each level's share of --max-requests-inflight; 429 only when the flow's queues are full or the "
                   "wait passes a quarter of --request-timeout (docs/flowcontrol.md). "
                   "--no-enable-priority-and-fairness: 429 as soon as --max-requests-inflight are busy "
                   "(default %(default)s)")
    _flag(g, "--request-timeout", _NOT_NEGATIVE, s.request_timeout, "seconds a request that is not a watch or a tunnel "
          "may take, its answer written included (kube-apiserver's --request-timeout): then 504, or the answer is "
          "abandoned and its slot given back; a connection none of whose waiting bytes a client takes for this long "
          "is closed (0: no deadline)")
    _flag(g, "--max-watchers", _AT_LEAST_1, s.max_watchers, "watches open at once per worker, cached or passed "
          "through; more get 429 with Retry-After")
    _flag(g, "--max-header-bytes", _AT_LEAST_1, h.max_header_bytes, "request line and headers larger than this get 431")
    g.add_argument("--max-body-bytes", type=_AT_LEAST_0, default=h.max_body_bytes, help="request bodies larger than "
                   "this get 413 (default %(default)s, kube-apiserver's limit)")
    _flag(g, "--header-timeout", _POSITIVE, h.header_timeout, "seconds a client has to send a complete request head "
          "(slowloris defence)")
    _flag(g, "--body-timeout", _POSITIVE, h.body_timeout, "seconds a client has to send a request body once its head "
          "is in (slow bodies); then 408 and the connection is closed (kube-apiserver's request timeout)")
    _flag(g, "--keepalive-timeout", _POSITIVE, h.keepalive_timeout, "seconds an idle keep-alive connection is kept")
    _flag(g, "--max-connections", _AT_LEAST_0, h.max_connections, "open client connections per worker; more are closed "
          "at accept, unread (0: no limit)")
    _flag(g, "--max-connections-per-client", _AT_LEAST_0, h.max_connections_per_client, "open connections per client "
          "IP address per worker; the first request on one more gets 429 with Retry-After and the connection is closed "
          "(0: no limit, as kube-apiserver; set it only where the proxy sees each client's own address, never "
          "behind a load balancer or NAT that rewrites them: docs/security.md)")
    _flag(g, "--max-connection-buffer-bytes", _AT_LEAST_1, h.max_connection_buffer_bytes, "request bytes (heads and "
          "bodies) one connection may have sent and not yet had answered; past it the connection is not read until "
          "earlier requests are answered (never below one request of --max-header-bytes + --max-body-bytes)")
    _flag(g, "--max-request-buffer-bytes", _AT_LEAST_0, h.max_request_buffer_bytes, "the same over all connections of "
          "a worker; requests that would exceed it get 429 with Retry-After, health probes excepted (0: no limit)")
    _flag(g, "--http2-max-streams-per-connection", Count(1, _MAX_HTTP2_STREAMS), _H2.max_concurrent_streams, "HTTP/2 "
          "streams (each watch holds one) a client may open at once on one connection: "
          "SETTINGS_MAX_CONCURRENT_STREAMS, kube-apiserver's flag and default")


def _sim_flags(p: Group, prefix: str = "") -> None:
    _flag(p, f"--{prefix}objects", _AT_LEAST_0, _SIM.objects, "pods to create at start")
    _flag(p, f"--{prefix}namespaces", _AT_LEAST_1, _SIM.namespaces, "namespaces ns-0..ns-N-1 to spread them over")
    _flag(p, f"--{prefix}nodes", _AT_LEAST_0, _SIM.nodes, "nodes to schedule pods on")
    p.add_argument(f"--{prefix}churn", type=_NOT_NEGATIVE, default=_SIM.churn, metavar="EVENTS_PER_S",
                   help="writes per second: pod updates, creates and deletes (default %(default)s)")
    _flag(p, f"--{prefix}seed", _AT_LEAST_0, _SIM.seed, "random seed for generated objects")
    p.add_argument(f"--{prefix}policy-file", help="users, tokens and RBAC-like rules (YAML; see watchcache/sim/"
                   "policy-example.yaml): the simulated cluster answers TokenReview/SubjectAccessReview and enforces "
                   "them (default: no authentication)")
    p.add_argument(f"--{prefix}state-file", help="journal every commit to this file and replay it at start, so the "
                   "cluster survives restarts (default: in memory only)")


def _resource_ids(text: str) -> str:
    """``--resources``: each id parses (RESOURCE, VERSION/RESOURCE, GROUP/VERSION/RESOURCE); whether the
    upstream serves it is for discovery to say. ``all`` alone: every list-watchable kind."""
    ids = [i.strip() for i in text.split(",") if i.strip()]
    if "all" in ids:
        if ids != ["all"]:
            raise argparse.ArgumentTypeError("'all' cannot be combined with other resources (use --cache-exclude)")
        return text
    for resource_id in ids:
        try:
            parse_resource_id(resource_id)
        except ResourceResolutionError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _excluded_ids(text: str) -> str:
    """``--cache-exclude``: ids as ``--resources`` takes them (not ``all``: that is ``--no-cache-on-demand``)."""
    if "all" in (i.strip() for i in text.split(",")):
        raise argparse.ArgumentTypeError("'all' is not a resource: to cache only --resources, use --no-cache-on-demand")
    return _resource_ids(text)


def _upstream_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("upstream: the apiserver to cache (default: found as kubectl finds it)")
    g.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (exec plugins, proxy-url, certificates, "
                   "tokens, basic auth as client-go; default: KUBECONFIG's files merged, else ~/.kube/config, else "
                   "the pod's service account)")
    g.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current-context)")
    g.add_argument("--in-cluster", action="store_true", help="use the pod's service account and "
                   "KUBERNETES_SERVICE_HOST, whatever kubeconfig is around")
    g.add_argument("--upstream", metavar="URL", help="upstream apiserver URL, e.g. https://10.0.0.1:6443, with "
                   "the next five flags")
    g.add_argument("--token-file", metavar="FILE", help="bearer token file for --upstream (re-read as it rotates)")
    g.add_argument("--client-certificate", metavar="FILE", help="client certificate file for --upstream")
    g.add_argument("--client-key", metavar="FILE", help="client key file for --upstream")
    g.add_argument("--certificate-authority", metavar="FILE", help="CA bundle to verify --upstream's certificate")
    g.add_argument("--insecure-skip-tls-verify", action="store_true", help="do not verify --upstream's "
                   "certificate (never in production)")
    g.add_argument("--simulated", action="store_true", help="no apiserver: cache an embedded SIMULATED cluster "
                   "(demos and tests; shaped by the --sim-* flags; `watchcache demo` runs it as two processes)")
    g.add_argument("--resources", type=_resource_ids, default="", help="comma-separated resources cached from the "
                   "start (readiness waits for them), e.g. pods,configmaps,apps/v1/deployments, or 'all': every "
                   "list-watchable kind at once (default: pods, nodes, namespaces, services, configmaps, "
                   "serviceaccounts, endpoints, apps workloads, endpointslices; --simulated: all it has)")
    g.add_argument("--cache-on-demand", action=argparse.BooleanOptionalAction, default=_CACHING.on_demand,
                   help="cache any other list-watchable kind the upstream serves from its first LIST or WATCH "
                   "(its reads pass through until it has synced) (default %(default)s)")
    g.add_argument("--cache-exclude", type=_excluded_ids, default="", metavar="RESOURCES", help="comma-separated "
                   "resources never cached (passed through), whatever --resources and --cache-on-demand say")
    g.add_argument("--cache-idle", type=_NOT_NEGATIVE, default=_CACHING.idle, metavar="SECONDS", help="stop caching a "
                   "kind a read started once nobody has read it (no watch, no read) for this long, freeing its "
                   "memory; the next read starts it again; 0: never (default %(default)s)")
    _flag(g, "--cache-memory-bytes", _AT_LEAST_0, _CACHING.memory_bytes, "bytes the caches of a worker may hold "
          "(objects, history, indexes, derived encodings, protobuf caches: an estimate); over it, the least "
          "recently read kinds that reads started are dropped and passed through until they fit again; the kinds "
          "of --resources are never dropped; 0: no budget")
    g.add_argument("--worker-id", type=_AT_LEAST_0, help=argparse.SUPPRESS)
    g.add_argument("--shard-dir", help=argparse.SUPPRESS)


def _sim_auth_flags(p: Group) -> None:
    p.add_argument("--requestheader-client-ca-file", metavar="FILE", help="believe X-Remote-User/-Group/-Extra-* "
                   "headers on requests whose client certificate this CA signed (a front proxy, e.g. watchcache "
                   "serve --proxy-client-cert-file), as kube-apiserver's flag of that name; needs --tls-cert-file "
                   "and --policy-file")
    p.add_argument("--anonymous-auth", action=argparse.BooleanOptionalAction, default=_SIM.anonymous, help="with "
                   "--policy-file: requests without credentials are system:anonymous rather than 401 "
                   "(default %(default)s, as kube-apiserver)")
    p.add_argument("--requestheader-allowed-names", default="", metavar="CN,...", help="common names a "
                   "front-proxy certificate may have (default: any the CA signed)")


def _serve_flags(serve: argparse.ArgumentParser) -> None:
    _upstream_flags(serve)
    g = serve.add_argument_group("serving")
    _serving(g, proxy=True)
    g.add_argument("--workers", type=_AT_LEAST_1, help="worker processes sharing the port, each owning part of the "
                   "cache (default: the CPUs the container may use, from its cgroup CPU limit; 1 with --simulated)")
    add_auth_flags(serve.add_argument_group("authentication and authorization of cached reads"))
    add_identity_flags(serve.add_argument_group("pass-through of client-certificate users (--client-ca-file)"))
    _reads(serve.add_argument_group("tuning: cache and reads"), proxy=True)
    _delivery(serve.add_argument_group("tuning: watch delivery"))
    _limits(serve.add_argument_group("tuning: limits per worker"))
    t = serve.add_argument_group("tuning: exec, attach, cp, port-forward tunnels")
    t.add_argument("--tunnel-idle-timeout", type=_POSITIVE, default=_TUNNELS.idle_timeout, help="seconds without a "
                   "byte either way after which a tunnel is closed (default %(default)s: 4 h, the kubelet's "
                   "--streaming-connection-idle-timeout)")
    t.add_argument("--tunnel-max-duration", type=_POSITIVE, default=_TUNNELS.max_duration, help="seconds after which a "
                   "tunnel is closed whatever it does (default %(default)s: 24 h)")
    _flag(t, "--max-tunnels", _AT_LEAST_1, _TUNNELS.max_tunnels, "tunnels open at once per worker; more get 429 with "
          "Retry-After")
    _backfill(serve.add_argument_group("tuning: history older than the cache's window (restarts without relists)"))
    _sim_flags(serve.add_argument_group("simulated cluster (with --simulated only)"), "sim-")


def _backfill(g: Group) -> None:
    b = _BACKFILL
    g.add_argument("--backfill", action=argparse.BooleanOptionalAction, default=b.enabled, help="a watch, or an "
                   "exact LIST or continue page, at a resourceVersion older than the cache's history (a client "
                   "resuming after this proxy, a worker or a follow stream restarted) is served from the upstream's "
                   "history, fetched once for every client that needs it, instead of 410 and a relist "
                   "(docs/reliability.md; default %(default)s)")
    _flag(g, "--backfill-wait", _POSITIVE, b.wait, "seconds a request waits for that history before its 410")
    _flag(g, "--backfill-unreachable-for", _NOT_NEGATIVE, b.unreachable_for, "seconds of failing fetches in "
          "a row during which an upstream that cannot be asked (refused, cut, 429, 5xx) gets its requests 429 with "
          "Retry-After (clients come back from the same resourceVersion) before 410 (they relist); 0: 410 at once")
    _flag(g, "--backfill-max-events", _AT_LEAST_1, b.max_events, "events one fetch may bring (how far back it "
          "reaches); more: 410")
    _flag(g, "--backfill-max-bytes", _AT_LEAST_1, b.max_bytes, "object bytes of those events")
    _flag(g, "--backfill-concurrency", _AT_LEAST_1, b.concurrency, "fetches from the upstream at once per worker")
    _flag(g, "--backfill-memory-bytes", _AT_LEAST_1, b.memory_bytes, "bytes the fetches of a worker may hold at once "
          "(the LIST at the old resourceVersion included)")


def _sim_command_flags(sim: argparse.ArgumentParser) -> None:
    _serving(sim.add_argument_group("serving"), proxy=False)
    _sim_flags(sim.add_argument_group("the simulated cluster"))
    _sim_auth_flags(sim.add_argument_group("authentication (with --policy-file)"))
    sim.add_argument("--crds", action="store_true", help="serve CustomResourceDefinitions: each one created "
                     "becomes a resource of the cluster at once, and deleting it deletes its objects and the resource "
                     "(no schemas, no conversion; not with --state-file)")
    sim.add_argument("--flowcontrol", action="store_true", help="serve flowcontrol.apiserver.k8s.io/v1 FlowSchemas and "
                     "PriorityLevelConfigurations, created as kube's suggested configuration (the proxy follows them)")
    _reads(sim.add_argument_group("tuning: reads"), proxy=False)
    _delivery(sim.add_argument_group("tuning: watch delivery"))
    # The simulated cluster's clients are tests and benchmarks on one host: no per-address limit.
    _limits(sim.add_argument_group("tuning: limits"))


# fmt: on


class _Parser(argparse.ArgumentParser):
    """Says what is wrong with the command line in one line (the flag's name, what it wants) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="watchcache", description="A sharded, high-throughput watch cache for the Kubernetes API.")
    parser.add_argument("--version", action="version", version=f"watchcache {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "sim",
        help="run the simulated Kubernetes cluster (a writable in-memory API)",
        usage="watchcache sim [--listen HOST:PORT] [--objects N] [--namespaces N] [--churn EVENTS_PER_S] [options]",
        description="A writable in-memory Kubernetes API with a churn generator, for demos, tests and load tests.",
    )
    _sim_command_flags(sim)
    serve = sub.add_parser(
        "serve",
        help="run the watch cache",
        usage="watchcache serve [--kubeconfig FILE] [--context NAME] | --in-cluster | --upstream URL [...] | "
        "--simulated\n       [--listen HOST:PORT] [--tls-cert-file FILE --tls-private-key-file FILE] [options]",
        description=(
            "Serve GET/LIST/WATCH from a revisioned in-memory cache fed by one list+watch per resource; "
            "everything else passes through to the upstream apiserver, found as kubectl finds it (exec "
            "credential plugins, proxy-url and KUBECONFIG included) unless a flag below names it. Without one "
            "and without a kubeconfig it stops with an error; --simulated caches a simulated cluster instead."
        ),
    )
    _serve_flags(serve)
    demo = sub.add_parser(
        "demo",
        help="run a simulated cluster and the watch cache in front of it (two processes)",
        description="Starts `watchcache sim` and `watchcache serve --upstream` in front of it; prints the URL "
        "and a kubectl line to try.",
    )
    demo.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="the proxy's address (default %(default)s)",
    )
    demo.add_argument(
        "--sim-listen",
        type=listen_address,
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="the simulated cluster's (default %(default)s)",
    )
    demo.add_argument(
        "--objects", type=_AT_LEAST_0, default=1000, help="pods in the simulated cluster (default %(default)s)"
    )
    demo.add_argument("--namespaces", type=_AT_LEAST_1, default=10, help="namespaces (default %(default)s)")
    demo.add_argument("--churn", type=_NOT_NEGATIVE, default=5.0, help="writes per second (default %(default)s)")
    return parser


def upstream_flags(args: argparse.Namespace) -> UpstreamFlags:
    """The flags that name the apiserver, read off the command line once."""
    return UpstreamFlags(
        upstream=args.upstream,
        kubeconfig=args.kubeconfig,
        context=args.context,
        in_cluster=args.in_cluster,
        simulated=args.simulated,
        token_file=args.token_file,
        client_certificate=args.client_certificate,
        client_key=args.client_key,
        certificate_authority=args.certificate_authority,
        insecure_skip_tls_verify=args.insecure_skip_tls_verify,
    )

"""What one ``watchcache`` process is told to be: its options, their defaults and their checks.

The command line only declares flags; the option objects here (and ``ServeConfig``,
``CacheConfig``, ``HttpLimits``, ``ReflectorConfig``, ``AuthOptions``, ``TlsOptions``) own the
defaults the flags show and refuse what cannot work, with the message the user sees.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from watchcache.argtypes import parse_listen
from watchcache.auth.gate import AuthOptions
from watchcache.auth.options import auth_options
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.backfill import BackfillLimits
from watchcache.dispatch.lifecycle import CachePolicy
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.tls import TlsOptions
from watchcache.resources import ResourceType
from watchcache.server.config import ServeConfig
from watchcache.server.tunnel import TunnelLimits
from watchcache.shard.layout import ShardDir
from watchcache.shard.ownership import owner_of
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.discovery import DEFAULT_RESOURCES, ResourceResolutionError, parse_resource_id
from watchcache.upstream.identity import IdentityOptions
from watchcache.upstream.identity_options import check_identity_files, identity_options
from watchcache.upstream.reflector import ReflectorConfig


@dataclass(frozen=True)
class ShardOptions:
    """This process is worker ``worker_id`` of ``workers`` (set by the supervisor)."""

    worker_id: int
    workers: int
    shard_dir: str

    @property
    def layout(self) -> ShardDir:
        """What is in the shard directory (``shard/layout.py``)."""
        return ShardDir(Path(self.shard_dir))

    def owns(self, resource: ResourceType) -> bool:
        return owner_of(resource.path_id(), self.workers) == self.worker_id


def owns(shard: ShardOptions | None, resource: ResourceType) -> bool:
    """Whether this process reflects ``resource`` itself (always, without workers)."""
    return shard is None or shard.owns(resource)


def first_worker(shard: ShardOptions | None) -> bool:
    """Whether this process speaks for its group in logs that every worker would repeat (a start-up
    finding about the flags or the host, the same for all): worker 0, or the only process."""
    return shard is None or shard.worker_id == 0


@dataclass(frozen=True)
class CachingOptions:
    """Which kinds are cached besides ``--resources`` (``dispatch/lifecycle.py``)."""

    # --cache-on-demand: a kind's first LIST or WATCH starts its cache.
    on_demand: bool = True
    # --cache-exclude: ids never cached.
    exclude: tuple[str, ...] = ()
    # --cache-idle: seconds unread after which an on-demand cache stops (0: never). Ten minutes: an
    # informer's watch keeps its kind read, so this only frees what one-off reads (kubectl) started,
    # and a restart costs one LIST.
    idle: float = 600.0
    # --cache-memory-bytes: per worker, what its caches may hold before the least recently read
    # kinds a read started are dropped (0: no budget).
    memory_bytes: int = 0

    def check(self) -> None:
        if self.idle < 0:
            raise ValueError("--cache-idle must be 0 (never) or more seconds")
        for resource_id in self.exclude:
            try:
                parse_resource_id(resource_id)
            except ResourceResolutionError as e:
                raise ValueError(f"--cache-exclude: {e}") from None


@dataclass(frozen=True)
class RunOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    serve: ServeConfig = field(default_factory=ServeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    resources: tuple[str, ...] = ()
    continue_key: bytes = b""
    upstream: UpstreamConfig | None = None
    reflector: ReflectorConfig = field(default_factory=ReflectorConfig)
    shard: ShardOptions | None = None
    # Delegated authn/authz of cached reads (None: anyone who reaches the port may read the cache).
    auth: AuthOptions | None = None
    http: HttpLimits = field(default_factory=HttpLimits)
    # Serve HTTPS (None: plain HTTP).
    tls: TlsOptions | None = None
    # Offer HTTP/2 (ALPN h2) on the TLS listener, with these limits (None: HTTP/1.1 only; --http2).
    http2: H2Limits | None = None
    # Connection upgrades passed through to the upstream (exec, attach, port-forward).
    tunnels: TunnelLimits = field(default_factory=TunnelLimits)
    # How pass-through requests of client-certificate users reach the upstream (None: refused).
    identity: IdentityOptions | None = None
    # Reads and watches older than the window: fetched from the upstream (or the owner worker).
    backfill: BackfillLimits = field(default_factory=BackfillLimits)
    caching: CachingOptions = field(default_factory=CachingOptions)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, upstream: UpstreamConfig | None = None, workers: int = 1
    ) -> RunOptions:
        """The options of ``watchcache sim`` or ``watchcache serve`` (worker of ``workers``) from their flags."""
        host, port = parse_listen(args.listen)
        g = vars(args)
        key = _continue_key(args.continue_token_key_file)
        shard = None
        if g.get("worker_id") is not None:
            shard = ShardOptions(args.worker_id, workers, args.shard_dir)
        return cls(
            host=host,
            port=port,
            serve=ServeConfig(
                fresh_wait=args.fresh_wait,
                bookmark_interval=args.bookmark_interval,
                min_request_timeout=args.min_request_timeout,
                max_limit=args.max_limit,
                watch_max_pending_bytes=args.max_watch_buffer_bytes,
                watch_max_total_bytes=args.max_watch_buffer_total_bytes,
                max_requests_inflight=args.max_requests_inflight,
                max_requests_waiting=args.max_requests_waiting,
                priority_and_fairness=args.enable_priority_and_fairness,
                request_timeout=args.request_timeout,
                delivery_sample=args.delivery_sample,
                watch_flush_interval=args.watch_flush_interval,
                watch_flush_pacing=args.watch_flush_pacing,
                watch_flush_max_delay=args.watch_flush_max_delay,
                max_watchers=args.max_watchers,
            ),
            http=HttpLimits(
                max_header_bytes=args.max_header_bytes,
                max_body_bytes=args.max_body_bytes,
                header_timeout=args.header_timeout,
                body_timeout=args.body_timeout,
                keepalive_timeout=args.keepalive_timeout,
                send_timeout=args.request_timeout,
                max_connections=args.max_connections,
                max_connections_per_client=args.max_connections_per_client,
                max_connection_buffer_bytes=args.max_connection_buffer_bytes,
                max_request_buffer_bytes=args.max_request_buffer_bytes,
            ),
            tls=_tls(args),
            http2=_http2(args),
            cache=CacheConfig(history_max_events=args.history_max_events, history_max_age=args.history_max_age),
            resources=tuple(r.strip() for r in g.get("resources", "").split(",") if r.strip()),
            continue_key=key,
            upstream=upstream,
            reflector=ReflectorConfig(
                stall_timeout=g.get("stall_timeout", ReflectorConfig.stall_timeout),
                encoding_idle=g.get("encoding_idle_timeout", ReflectorConfig.encoding_idle),
            ),
            tunnels=TunnelLimits(
                idle_timeout=g.get("tunnel_idle_timeout", TunnelLimits.idle_timeout),
                max_duration=g.get("tunnel_max_duration", TunnelLimits.max_duration),
                max_tunnels=g.get("max_tunnels", TunnelLimits.max_tunnels),
            ),
            auth=auth_options(args, upstream_is_tls=getattr(upstream, "is_tls", False))
            if "authentication" in g
            else None,
            identity=_identity(args) if "client_cert_passthrough" in g else None,
            shard=shard,
            backfill=_backfill(args),
            caching=_caching(args),
        )


def _caching(args: argparse.Namespace) -> CachingOptions:
    g = vars(args)
    if "cache_on_demand" not in g:  # watchcache sim, serve --simulated: everything is cached
        return CachingOptions(on_demand=False)
    caching = CachingOptions(
        on_demand=args.cache_on_demand,
        exclude=tuple(r.strip() for r in (args.cache_exclude or "").split(",") if r.strip()),
        idle=args.cache_idle,
        memory_bytes=args.cache_memory_bytes,
    )
    caching.check()
    return caching


def cache_policy(options: RunOptions) -> CachePolicy:
    """The decisions ``options`` mean (``--resources``, ``--cache-*``, ``--authentication``)."""
    all_kinds = options.resources == ("all",)
    named = bool(options.resources) and not all_kinds
    ids = options.resources if named else DEFAULT_RESOURCES
    return CachePolicy(
        from_start=frozenset(parse_resource_id(i) for i in ids),
        defaults=not named,
        all_kinds=all_kinds,
        excluded=frozenset(parse_resource_id(i) for i in options.caching.exclude),
        on_demand=options.caching.on_demand,
        idle=options.caching.idle,
        secrets_on_demand=options.auth is not None,
        memory_bytes=options.caching.memory_bytes,
    )


def _continue_key(path: Path | None) -> bytes:
    if path is None:
        return b""
    try:
        return path.read_bytes().strip()
    except OSError as e:
        raise ValueError(f"--continue-token-key-file {path}: cannot read it: {e.strerror or e}") from None


def _backfill(args: argparse.Namespace) -> BackfillLimits:
    g = vars(args)
    if "backfill" not in g:  # watchcache sim: its history is its own
        return BackfillLimits(enabled=False)
    limits = BackfillLimits(
        enabled=args.backfill,
        wait=args.backfill_wait,
        unreachable_for=args.backfill_unreachable_for,
        max_events=args.backfill_max_events,
        max_bytes=args.backfill_max_bytes,
        concurrency=args.backfill_concurrency,
        memory_bytes=args.backfill_memory_bytes,
    )
    limits.check()
    return limits


def _identity(args: argparse.Namespace) -> IdentityOptions:
    identity = identity_options(args)
    check_identity_files(identity)
    return identity


def _tls(args: argparse.Namespace) -> TlsOptions | None:
    """The serving certificate, loaded once now: a file that cannot be read stops the start, not every handshake."""
    tls = TlsOptions.from_files(args.tls_cert_file, args.tls_private_key_file, args.client_ca_file)
    if tls is not None:
        tls.check()
    return tls


def _http2(args: argparse.Namespace) -> H2Limits | None:
    if not getattr(args, "http2", False):
        return None
    if not args.tls_cert_file:
        raise ValueError("--http2 needs --tls-cert-file: HTTP/2 is offered over TLS only (ALPN h2), as kube does")
    return H2Limits(max_concurrent_streams=args.http2_max_streams_per_connection)


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


def worker_count(requested: int | None, has_upstream: bool) -> int:
    """``--workers``: by default the CPUs the container may use in front of an apiserver, else 1."""
    workers = requested if requested is not None else effective_cpus() if has_upstream else 1
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    if workers > 1 and not has_upstream:
        raise ValueError("--workers > 1 needs a real upstream: the --simulated cluster lives in one process")
    return workers

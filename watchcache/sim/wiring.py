"""The simulator's two modes, assembled on the product's process lifecycle.

``watchcache sim`` serves the simulated cluster itself: its storage is the cache the read
path serves from. ``watchcache serve --simulated`` runs the proxy fed in-process by an
embedded simulated cluster (see ``sim.embedded``): one process, for quick demos and tests,
and it says so in its log and in ``/readyz?verbose``.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from watchcache.auth.gate import AuthOptions, Gate
from watchcache.auth.requestheader import RequestHeaderAuthenticator, RequestHeaderNames, ca_subjects
from watchcache.dispatch.cacher import Cacher
from watchcache.fairness.defaults import flow_schemas, priority_levels
from watchcache.http.request import Request
from watchcache.resources import BUILTIN, FLOWCONTROL, ResourceRegistry
from watchcache.server.app import ApiHandler
from watchcache.service.lifecycle import Wiring, api_context, run
from watchcache.service.options import RunOptions
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.churn import Churn, populate
from watchcache.sim.cluster import SimCluster
from watchcache.sim.crds import CRDS
from watchcache.sim.embedded import EmbeddedUpstream, SimUpstream
from watchcache.sim.faults import FaultInjector
from watchcache.sim.gate import ApiserverGate
from watchcache.sim.options import SimOptions
from watchcache.sim.policy import load_policy

log = logging.getLogger("watchcache")

# The /readyz?verbose line of ``serve --simulated``.
SIMULATED_READY_LINE = "[+]upstream ok: SIMULATED cluster in this process (serve --simulated), not an apiserver"


def _sim_cluster(options: RunOptions, sim: SimOptions) -> SimCluster:
    try:
        types = (*BUILTIN, *((CRDS,) if sim.crds else ()), *(FLOWCONTROL if sim.flowcontrol else ()))
        cluster = SimCluster(ResourceRegistry(types), options.cache, state_file=sim.state_file)
    except OSError as e:
        raise ValueError(f"--{sim.flag_prefix}state-file {sim.state_file}: {e.strerror or e}") from None
    if not cluster.restored:  # a restart from the journal already has its objects
        populate(cluster, objects=sim.objects, namespaces=sim.namespaces, nodes=sim.nodes, seed=sim.seed)
        if sim.flowcontrol:
            for obj in [*flow_schemas(), *priority_levels()]:
                cluster.create(FLOWCONTROL[obj["kind"] != "FlowSchema"], "", obj)
    return cluster


def _churn_task(cluster: SimCluster, sim: SimOptions) -> list[asyncio.Future[None]]:
    if sim.churn <= 0:
        return []
    return [asyncio.ensure_future(Churn(cluster, sim.churn, seed=sim.seed).run())]


async def wire_sim(options: RunOptions, sim: SimOptions) -> Wiring:
    """The simulated cluster: its storage is the cache the read path serves from."""
    cluster = _sim_cluster(options, sim)
    upstream = SimUpstream(cluster)
    ctx = api_context(options, cluster.registry, cluster.cachers, upstream)
    upstream.faults = faults = FaultInjector(ctx.flusher)
    gate = None
    if sim.policy_file:
        upstream.policy = load_policy(sim.policy_file)
        auth = AuthOptions(anonymous=sim.anonymous)
        ctx.gate = upstream.gate = gate = ApiserverGate.build(LocalReviewClient(upstream.policy), auth)
        log.info("policy %s: requests are authenticated and authorized", sim.policy_file)
    requestheader_ca = sim.requestheader_ca_file
    if requestheader_ca:
        if gate is None or not options.tls:
            raise ValueError("--requestheader-client-ca-file needs --policy-file and --tls-cert-file")
        issuers = ca_subjects(requestheader_ca)
        client_ca = options.tls.client_ca_file
        if client_ca and any(s in issuers for s in ca_subjects(client_ca)):
            raise ValueError("--requestheader-client-ca-file and --client-ca-file must be CAs with different subjects")
        names = RequestHeaderNames()
        gate.requestheader = RequestHeaderAuthenticator(issuers, sim.requestheader_allowed_names, names)
        log.info("front-proxy authentication: %s from CA %s", ", ".join(names.username), requestheader_ca)
    handler = ApiHandler(ctx)

    def inject(request: Request) -> None:
        error = faults.error_for(request)
        if error is not None:
            raise error

    handler.admission.append(inject)

    async def close() -> None:
        cluster.close()

    wiring = Wiring(ctx, handler, _churn_task(cluster, sim), [close], requestheader_ca_file=requestheader_ca)
    wiring.housekeeping.append(faults.tick)
    return wiring


async def wire_embedded(options: RunOptions, sim: SimOptions) -> Wiring:
    """The proxy fed in-process by an embedded simulated cluster (see ``sim.embedded``)."""
    cluster = _sim_cluster(options, sim)
    try:
        registry = cluster.registry.select(list(options.resources)) if options.resources else cluster.registry
    except KeyError as e:
        known = ", ".join(t.path_id() for t in cluster.registry.types)
        raise ValueError(f"--resources: the simulated cluster does not serve {e.args[0]} (it serves {known})") from None
    cachers = {t: Cacher(t, options.cache) for t in registry.types}
    upstream = EmbeddedUpstream(cluster, cachers)
    ctx = api_context(options, registry, cachers, upstream)
    if sim.policy_file:
        upstream.policy = load_policy(sim.policy_file)
        upstream.gate = Gate.build(LocalReviewClient(upstream.policy), AuthOptions())
        if options.auth is not None:
            ctx.gate = Gate.build(LocalReviewClient(upstream.policy), options.auth)
    log.warning(
        "upstream: a SIMULATED cluster in this process (--simulated: %d pods, %d namespaces, churn %s/s), not an "
        "apiserver: for demos and tests only",
        sim.objects,
        sim.namespaces,
        sim.churn,
    )
    handler = ApiHandler(ctx)
    handler.readiness_checks.append(lambda: (True, SIMULATED_READY_LINE))
    return Wiring(ctx, handler, _churn_task(cluster, sim))


def run_sim(options: RunOptions, sim: SimOptions, listener: socket.socket | None = None) -> None:
    """``watchcache sim``."""
    run("watchcache sim", options, lambda o: wire_sim(o, sim), listener)


def run_embedded(options: RunOptions, sim: SimOptions, listener: socket.socket | None = None) -> None:
    """``watchcache serve --simulated``."""
    run("watchcache serve", options, lambda o: wire_embedded(o, sim), listener)

"""upstream/metrics.py: reflectors, consistency proofs, pass-through identity and the proxy's own upstream errors."""

from __future__ import annotations

from tests.support.collectors import POD, k, scrape
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.upstream.client import UpstreamError
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.failures import LastFailures
from watchcache.upstream.identity import PassthroughIdentity
from watchcache.upstream.metrics import (
    ConsistencyCollector,
    IdentityCollector,
    ReflectorCollector,
    UpstreamErrorsCollector,
)
from watchcache.upstream.reflector import Reflector, ReflectorState


def test_reflectors_consistency_and_pass_through_identity() -> None:
    pods = Cacher(PODS)
    reflector = Reflector(None, pods)  # type: ignore[arg-type]  # never run: only its counters are read
    reflector.relists, reflector.watch_restarts, reflector.gone = 1, 5, 2
    reflector.state, reflector.last_event_at = ReflectorState.WATCHING, 95.0
    consistent = ConsistentReads(None)  # type: ignore[arg-type]
    consistent.probe_outcomes[(PODS, "progress")] += 6
    consistent.probe_outcomes[(PODS, "timeout")] += 1
    consistent._target(PODS).fetches.update({"ok": 9, "error": 2})
    identity = PassthroughIdentity()
    identity.forwarded.update({"client": 12, "proxy": 3})
    identity.refused = 1

    samples, _ = scrape(
        ReflectorCollector(lambda: [reflector], clock=lambda: 100.0),
        ConsistencyCollector(consistent),
        IdentityCollector(identity),
    )

    assert samples[k("watchcache_reflector_relists_total", **POD)] == 1
    assert samples[k("watchcache_reflector_watch_restarts_total", **POD)] == 5
    assert samples[k("watchcache_reflector_gone_total", **POD)] == 2
    assert samples[k("watchcache_reflector_last_event_age_seconds", **POD)] == 5.0
    assert samples[k("watchcache_reflector_state", **POD, state="watching")] == 1
    assert samples[k("watchcache_consistency_probes_total", **POD, outcome="progress")] == 6
    assert samples[k("watchcache_consistency_probes_total", **POD, outcome="timeout")] == 1
    assert samples[k("watchcache_consistency_target_fetches_total", **POD, outcome="ok")] == 9
    assert samples[k("watchcache_consistency_target_fetches_total", **POD, outcome="error")] == 2
    for route, count in (("client", 12), ("front-proxy", 0), ("proxy", 3), ("refused", 1)):
        assert samples[k("watchcache_passthrough_identity_total", route=route)] == count


def test_the_proxys_own_upstream_errors_by_resource_and_reason() -> None:
    failures = LastFailures("https://127.0.0.1:6443")
    forbidden = UpstreamError(403, "forbidden", {"kind": "Status", "code": 403, "reason": "Forbidden"})
    failures.failed(PODS, "list", forbidden, 1.0)
    failures.failed(PODS, "watch", forbidden, 1.0)
    failures.failed(None, "discovery", ConnectionRefusedError(111, "Connection refused"), 1.0)

    samples, _ = scrape(UpstreamErrorsCollector(failures))

    errors = {(dict(key[1])["resource"], dict(key[1])["reason"]): v for key, v in samples.items()
              if key[0] == "watchcache_upstream_errors_total"}  # fmt: skip
    assert errors == {
        ("pods", "forbidden"): 2,
        ("", "refused"): 1,  # discovery
        ("", "unauthorized"): 0,  # defined from the start, so that rate() is
        ("", "forbidden"): 0,
    }

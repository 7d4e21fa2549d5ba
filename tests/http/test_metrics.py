"""http/metrics.py: open connections, HTTP/2 connections and streams, request bytes held, from a real Admission."""

from __future__ import annotations

from tests.support.collectors import k, scrape
from watchcache.http.admission import Admission
from watchcache.http.metrics import AdmissionCollector


def test_connections_http2_streams_and_the_request_bytes_held() -> None:
    admission = Admission(max_connections=4, max_per_client=2)
    for peer in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        assert admission.connect(peer) is None
    admission.disconnect("10.0.0.1")
    admission.h2_connections, admission.h2_streams, admission.buffered = 1, 4, 900  # as the protocols count them

    samples, types = scrape(AdmissionCollector(admission))

    assert samples[k("watchcache_http_connections")] == 2
    assert samples[k("watchcache_http2_connections")] == 1
    assert samples[k("watchcache_http2_streams")] == 4
    assert samples[k("watchcache_http_request_buffer_bytes")] == 900
    assert set(types.values()) == {"gauge"}
    # Its refusals are exported with the handler's (server/metrics.py), in one family.
    assert "watchcache_rejected_requests" not in types

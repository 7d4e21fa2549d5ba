"""The HTTP server's metric families: its connections, HTTP/2 streams, and the request bytes held.

Read at scrape time from the server's ``Admission`` (shared by all its connections). Its
refusals by limit are part of ``watchcache_rejected_requests`` with the handler's own
(``server.metrics.HandlerCollector``): one family, whichever layer refused.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.http.admission import Admission

__all__ = ["AdmissionCollector"]


class AdmissionCollector(Collector):
    """Open connections (of which HTTP/2), HTTP/2 streams, and request bytes not answered yet."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self.admission
        yield GaugeMetricFamily("watchcache_http_connections", "Open client connections", value=admission.connections)
        yield GaugeMetricFamily(
            "watchcache_http2_connections",
            "Open client connections speaking HTTP/2",
            value=admission.h2_connections,
        )
        yield GaugeMetricFamily(
            "watchcache_http2_streams", "HTTP/2 streams open (each watch holds one)", value=admission.h2_streams
        )
        yield GaugeMetricFamily(
            "watchcache_http_request_buffer_bytes",
            "Request bytes (heads and bodies) received or announced and not answered yet",
            value=admission.buffered,
        )

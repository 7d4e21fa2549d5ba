"""watchcache/metrics.py: a process's registry (build info, no ``_created``), the merge of the workers' expositions.

Each package's collectors are tested beside the package (tests/<package>/test_metrics.py): the
components are real, counters the handlers own are set as the handlers count them, and exported
names, labels and values are spelled out, as dashboards and alerts (deploy/) read them.
"""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import Counter, Histogram, enable_created_metrics
from prometheus_client.parser import text_string_to_metric_families

from watchcache.metrics import merge_workers, process_registry, render


def test_merge_labels_each_workers_samples_and_keeps_one_family() -> None:
    one = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 3.0\n'
    two = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 4.0\n'
    families = list(text_string_to_metric_families(merge_workers([(0, one), (1, two)]).decode()))
    assert [f.name for f in families] == ["x"]
    assert {(s.labels["worker"], s.value) for s in families[0].samples} == {("0", 3.0), ("1", 4.0)}


def test_a_process_registry_has_its_build_info_and_no_created_families() -> None:
    enable_created_metrics()  # prometheus-client's default, whatever ran before in this process
    try:
        registry = process_registry()
        Counter("x_requests", "X", ["code"], registry=registry).labels("200").inc()
        Histogram("x_seconds", "X", registry=registry).observe(0.1)
        families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    finally:
        enable_created_metrics()
    assert sorted(families) == ["watchcache_build_info", "x_requests", "x_seconds"]  # no x_requests_created
    assert not [s.name for f in families.values() for s in f.samples if s.name.endswith("_created")]
    (info,) = families["watchcache_build_info"].samples
    assert families["watchcache_build_info"].type == "gauge"
    assert info.value == 1
    assert info.labels == {
        "version": importlib.metadata.version("watchcache"),
        "python_version": platform.python_version(),
    }

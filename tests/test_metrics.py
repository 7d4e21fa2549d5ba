"""watchcache/metrics.py: the merge of the workers' expositions.

Each package's collectors are tested beside the package (tests/<package>/test_metrics.py): the
components are real, counters the handlers own are set as the handlers count them, and exported
names, labels and values are spelled out, as dashboards and alerts (deploy/) read them.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from watchcache.metrics import merge_workers


def test_merge_labels_each_workers_samples_and_keeps_one_family() -> None:
    one = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 3.0\n'
    two = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 4.0\n'
    families = list(text_string_to_metric_families(merge_workers([(0, one), (1, two)]).decode()))
    assert [f.name for f in families] == ["x"]
    assert {(s.labels["worker"], s.value) for s in families[0].samples} == {("0", 3.0), ("1", 4.0)}

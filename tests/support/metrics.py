"""Scrape a process's /metrics and sum samples, with prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> tuple[str, dict[str, list]]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return text, samples


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))

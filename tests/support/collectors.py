"""Scrape collectors in-process: every sample of a known state by name and labels (tests of each ``metrics`` module)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

POD = {"group": "", "resource": "pods"}
CM = {"group": "", "resource": "configmaps"}


def k(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A sample's key in ``scrape``'s result: its name and its labels, sorted."""
    return name, tuple(sorted(labels.items()))


def scrape(*collectors: Collector) -> tuple[Samples, dict[str, str]]:
    """Every sample as {(name, sorted labels): value}, and every family's type, through the text exposition."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return scrape_registry(registry)


def scrape_registry(registry: CollectorRegistry) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        types[family.name] = family.type
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types

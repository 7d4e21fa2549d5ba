"""On-demand caching's decisions (dispatch/lifecycle.py): which kinds start when, which stop, which
go over the memory budget. No I/O: every case is a policy and a kind."""

from __future__ import annotations

import pytest

from watchcache.dispatch.lifecycle import CachePolicy, Usage, Why, idle, over_budget, seconds
from watchcache.resources import CONFIGMAPS, PODS, SECRETS, ResourceType

EVENTS = ResourceType("", "v1", "events", "Event", True, known_fields=False)
WIDGETS = ResourceType("example.com", "v1", "widgets", "Widget", True, known_fields=False)
DEFAULTS = frozenset({("", "v1", "pods"), ("", "v1", "configmaps")})


def test_the_defaults_are_cached_from_the_start_and_every_other_kind_on_its_first_read() -> None:
    policy = CachePolicy(from_start=DEFAULTS)
    assert policy.at_start(PODS) is Why.DEFAULT
    assert policy.at_start(EVENTS) is None
    assert policy.refusal(EVENTS) is None and policy.started_by_read(EVENTS)
    assert policy.started_by_read(WIDGETS)  # a custom resource as a built-in kind
    assert not policy.started_by_read(PODS)  # already cached: nothing for a read to start


def test_named_resources_say_so_and_all_starts_every_kind_but_the_excluded() -> None:
    named = CachePolicy(from_start=frozenset({("", "v1", "pods")}), defaults=False)
    assert named.at_start(PODS) is Why.RESOURCES
    everything = CachePolicy(from_start=DEFAULTS, all_kinds=True, excluded=frozenset({("", "v1", "events")}))
    assert everything.at_start(PODS) is Why.DEFAULT  # readiness waits for the defaults only
    assert everything.at_start(WIDGETS) is Why.ALL
    assert everything.at_start(EVENTS) is None
    assert everything.refusal(EVENTS) == "excluded (--cache-exclude)"


def test_exclusion_wins_over_resources() -> None:
    policy = CachePolicy(from_start=DEFAULTS, excluded=frozenset({("", "v1", "configmaps")}))
    assert policy.at_start(CONFIGMAPS) is None
    assert policy.refusal(CONFIGMAPS) is not None


def test_without_on_demand_only_the_named_kinds_are_cached() -> None:
    policy = CachePolicy(from_start=DEFAULTS, on_demand=False)
    assert policy.refusal(EVENTS) == "not in --resources (--no-cache-on-demand)"
    assert policy.refusal(PODS) is None


@pytest.mark.parametrize("all_kinds", [False, True])
def test_secrets_without_authentication_are_cached_only_when_named(all_kinds: bool) -> None:
    open_port = CachePolicy(from_start=DEFAULTS, all_kinds=all_kinds, secrets_on_demand=False)
    assert open_port.refusal(SECRETS) is not None and "--authentication none" in open_port.refusal(SECRETS)
    assert open_port.at_start(SECRETS) is None
    named = CachePolicy(from_start=frozenset({("", "v1", "secrets")}), defaults=False, secrets_on_demand=False)
    assert named.refusal(SECRETS) is None and named.at_start(SECRETS) is Why.RESOURCES
    delegated = CachePolicy(from_start=DEFAULTS, all_kinds=all_kinds)
    assert delegated.refusal(SECRETS) is None


def test_a_cache_is_idle_only_without_watchers_replicas_and_reads() -> None:
    assert idle(now=700.0, last_used=100.0, watchers=0, replicas=0, idle_after=600.0)
    assert not idle(now=699.0, last_used=100.0, watchers=0, replicas=0, idle_after=600.0)
    assert not idle(now=10_000.0, last_used=100.0, watchers=1, replicas=0, idle_after=600.0)
    assert not idle(now=10_000.0, last_used=100.0, watchers=0, replicas=1, idle_after=600.0)
    assert not idle(now=10_000.0, last_used=100.0, watchers=0, replicas=0, idle_after=0.0)  # never
    assert seconds(0) == "never" and seconds(600.0) == "600s"


def test_over_budget_drops_the_least_recently_read_first_and_never_the_pinned() -> None:
    caches = [
        Usage("pods", 500, last_read=1.0, pinned=True),
        Usage("events", 300, last_read=2.0),
        Usage("leases", 100, last_read=5.0),
        Usage("widgets.example.com", 200, last_read=3.0),
    ]
    assert over_budget(caches, 0) == []
    assert over_budget(caches, 2_000) == []
    assert over_budget(caches, 900) == ["events"]
    assert over_budget(caches, 700) == ["events", "widgets.example.com"]
    # The pinned kinds stay whatever it costs: the budget is for what reads start.
    assert over_budget(caches, 100) == ["events", "widgets.example.com", "leases"]

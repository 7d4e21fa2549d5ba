"""One Go ``%q`` for every message that quotes a name or a value."""

from __future__ import annotations

import pytest

from watchcache.apierrors import StatusError
from watchcache.quoting import go_quote
from watchcache.resources import ResourceRegistry
from watchcache.sim.cluster import SimCluster

# strconv.Quote's output for each input (Go 1.24).
GO_QUOTED = [
    ("alice", '"alice"'),
    ('a"b', '"a\\"b"'),
    ("a\\b", '"a\\\\b"'),
    ("a\nb\tc", '"a\\nb\\tc"'),
    ("\a\b\f\r\v", '"\\a\\b\\f\\r\\v"'),
    ("\x01\x1f\x7f", '"\\x01\\x1f\\x7f"'),
    ("é日本", '"é日本"'),
    ("\u200b", '"\\u200b"'),  # zero-width space: a format character, not printable
    ("\u00a0", '"\\u00a0"'),  # no-break space: only the ASCII space is printable
    ("\ue000", '"\\ue000"'),  # private use
    ("😀", '"😀"'),
    ("\U000e0001", '"\\U000e0001"'),  # language tag: unprintable, beyond the BMP
]


@pytest.mark.parametrize(("text", "quoted"), GO_QUOTED)
def test_quoted_like_go(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_the_simulated_cluster_quotes_bad_names_like_go() -> None:
    """A field error quotes the bad value with %q (JSON's quoting writes \\u0001, Go writes \\x01)."""
    cluster = SimCluster(ResourceRegistry())
    configmaps = cluster.registry.by_id("configmaps")
    assert configmaps is not None
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bad\x01name", "namespace": "default"}}
    with pytest.raises(StatusError) as e:
        cluster.create(configmaps, "default", body)
    [cause] = (e.value.details or {})["causes"]
    assert cause["message"].startswith('Invalid value: "bad\\x01name": ')

"""A watched object's body is cut out of the upstream's event line, not encoded again (cache/object.py)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import pod
from watchcache.cache.object import CachedObject, body_in_event, encode_object
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.quoting import go_json_escape
from watchcache.resources import PODS, ResourceType

WIDGETS = ResourceType("example.com", "v1", "widgets", "Widget", True)

# As kube-apiserver writes a watch event: Go escapes <, > and & in strings; orjson does not.
KUBE_LINE = (
    b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d",'
    b'"resourceVersion":"12","labels":{"app":"x"},"annotations":{"url":"http://h/?a=1\\u0026b=2"}},'
    b'"spec":{"nodeName":"n1"},"status":{"phase":"Running"}}}'
)


def encode(resource: ResourceType, line: bytes) -> tuple[CachedObject, CachedObject]:
    """(from the line's bytes, encoded from the parse) for one event line."""
    event = orjson.loads(line)
    sliced = encode_object(
        resource, orjson.loads(line)["object"], body_in_event(resource, line, event["type"], len(event))
    )
    return sliced, encode_object(resource, event["object"])


def test_a_kube_event_keeps_the_upstreams_bytes_and_means_the_same_object():
    sliced, parsed = encode(PODS, KUBE_LINE)
    assert sliced.body == KUBE_LINE[len(b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1",') : -1]
    assert b"\\u0026" in sliced.body and sliced.body == parsed.body  # encoded here as Go encodes it
    assert sliced.decode() == parsed.decode()
    assert (sliced.key, sliced.rv, sliced.labels, sliced.fields) == (
        parsed.key,
        parsed.rv,
        parsed.labels,
        parsed.fields,
    )
    assert orjson.loads(sliced.typed_json(PODS)) == orjson.loads(KUBE_LINE)["object"]


def test_an_unstructured_objects_sorted_typemeta_is_cut_too():
    line = (
        b'{"type":"ADDED","object":{"apiVersion":"example.com/v1","kind":"Widget",'
        b'"metadata":{"name":"w","namespace":"d","resourceVersion":"5"},"spec":{"size":1}}}'
    )
    sliced, parsed = encode(WIDGETS, line)
    assert sliced.body == b'"metadata":{"name":"w","namespace":"d","resourceVersion":"5"},"spec":{"size":1}}'
    assert sliced.decode() == parsed.decode()


def test_lines_in_any_other_form_are_encoded_from_the_parse():
    obj = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"1"}}'
    others = [
        b'{"type":"MODIFIED","object":' + obj + b',"extra":{}}',  # a third key
        b'{"object":' + obj + b',"type":"MODIFIED"}',  # other key order
        b'{"type":"MODIFIED","object":' + obj + b" }",  # whitespace
        b'{"type": "MODIFIED", "object": ' + obj + b"}",
        b'{"type":"MODIFIED","object":{"metadata":{"name":"a","namespace":"d","resourceVersion":"1"}}}',  # no TypeMeta
        b'{"type":"MODIFIED","object":{"kind":"Widget","apiVersion":"v1","metadata":{"name":"a"}}}',  # another kind
        b'{"type":"BOOKMARK","object":' + obj + b"}",
        b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1"}}',  # TypeMeta only
    ]
    for line in others:
        event = orjson.loads(line)
        assert body_in_event(PODS, line, event.get("type"), len(event)) is None, line


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=3),
    spec=st.dictionaries(st.sampled_from(["nodeName", "hostNetwork", "x", "<&>"]), _json, max_size=4),
    status=st.dictionaries(st.sampled_from(["phase", "podIP", "y"]), _json, max_size=3),
    kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
)
def test_cut_or_encoded_the_cached_object_is_the_same(labels: Any, spec: Any, status: Any, kind: str) -> None:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "d", "resourceVersion": "7", "labels": labels},
        "spec": spec,
        "status": status,
    }
    line = go_json_escape(orjson.dumps({"type": kind, "object": obj}))  # as kube writes it
    sliced, parsed = encode(PODS, line)
    assert body_in_event(PODS, line, kind, 2) is not None
    assert sliced.body == parsed.body  # the cache encodes as Go does: the same bytes
    assert (sliced.key, sliced.rv, sliced.labels, sliced.fields) == (
        parsed.key,
        parsed.rv,
        parsed.labels,
        parsed.fields,
    )


def test_a_relist_finding_the_same_object_in_other_bytes_at_its_rv_sends_nothing():
    watched, listed = encode(PODS, KUBE_LINE)
    cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    cache.replace([watched], 12)
    assert cache.relist([listed], 20) == []
    changed = CachedObject(listed.key, "d", "a", 12, listed.labels, listed.fields, listed.body.replace(b"n1", b"n2"))
    assert [e.type for e in cache.relist([changed], 30)] == ["MODIFIED"]
    assert cache.relist([pod("a", "d", 31)], 40)[0].type == "MODIFIED"

"""Custom resources are written as kube-apiserver writes them, and select what kube lets them select.

kube-apiserver serves a custom resource as unstructured objects: every LIST item keeps its
``kind``/``apiVersion`` (built-in kinds' items have none). A field selector on a custom resource
may name the CRD's ``selectableFields``, which only the upstream knows: such a request is passed
through. Built-in kinds refuse an unknown field with the wording of their own conversion function.
"""

from __future__ import annotations

import orjson
import pytest

from watchcache.cache.encoding import FULL_JSON
from watchcache.cache.object import encode_object
from watchcache.cache.predicate import SelectionPredicate, UnsupportedField
from watchcache.resources import CONFIGMAPS, DEPLOYMENTS, NODES, PODS, ResourceType
from watchcache.selectors import SelectorError

WIDGETS = ResourceType("example.com", "v1", "widgets", "Widget", True, "widget")
CLUSTER_WIDGETS = ResourceType("example.com", "v1", "clusterwidgets", "ClusterWidget", False, "clusterwidget")


def widget(name: str) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": "ns",
            "resourceVersion": "5"}, "spec": {"size": 1}}  # fmt: skip


def test_custom_resource_list_items_keep_their_type_meta():
    objs = [encode_object(WIDGETS, widget(n)) for n in ("a", "b")]
    doc = orjson.loads(b"".join(FULL_JSON.list_parts(WIDGETS, objs, 7, None, None)))
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in doc["items"]] == [
        ("Widget", "example.com/v1", "a"),
        ("Widget", "example.com/v1", "b"),
    ]
    assert doc["kind"] == "WidgetList"


def test_built_in_list_items_have_no_type_meta():
    cm = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "5"}, "data": {}}
    doc = orjson.loads(b"".join(FULL_JSON.list_parts(CONFIGMAPS, [encode_object(CONFIGMAPS, cm)], 7, None, None)))
    assert "kind" not in doc["items"][0]


@pytest.mark.parametrize(
    ("resource", "message"),
    [
        (CONFIGMAPS, '"data.x" is not a known field selector: only "metadata.name", "metadata.namespace"'),
        (DEPLOYMENTS, '"data.x" is not a known field selector: only "metadata.name", "metadata.namespace"'),
        (PODS, "field label not supported: data.x"),
        (NODES, "field label not supported: data.x"),
    ],
)
def test_an_unknown_field_is_refused_in_kubes_words_for_the_kind(resource: ResourceType, message: str):
    with pytest.raises(SelectorError) as e:
        SelectionPredicate.parse(resource, "ns", "", "data.x=1")
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("resource", "selector"),
    [(WIDGETS, "spec.size=1"), (CLUSTER_WIDGETS, "spec.size=1"), (CLUSTER_WIDGETS, "metadata.namespace=ns")],
)
def test_a_custom_resources_unknown_field_is_the_upstreams_to_judge(resource: ResourceType, selector: str):
    # spec.size may be one of the CRD's selectableFields; a cluster-scoped CRD does not select on
    # metadata.namespace (kube: "field label not supported")
    with pytest.raises(UnsupportedField) as e:
        SelectionPredicate.parse(resource, None, "", selector)
    assert e.value.custom


def test_a_custom_resource_selects_on_name_and_namespace_from_the_cache():
    p = SelectionPredicate.parse(WIDGETS, "ns", "", "metadata.name=a,metadata.namespace=ns")
    assert p.matches(encode_object(WIDGETS, widget("a")))
    assert not p.matches(encode_object(WIDGETS, widget("b")))


def test_a_custom_resources_last_page_says_continue_empty():
    # kube's unstructured lists write "continue": "" when there is no next page (built-in kinds omit it)
    objs = [encode_object(WIDGETS, widget("a"))]
    assert orjson.loads(b"".join(FULL_JSON.list_parts(WIDGETS, objs, 7, None, None)))["metadata"] == {
        "resourceVersion": "7",
        "continue": "",
    }
    paged = orjson.loads(b"".join(FULL_JSON.list_parts(WIDGETS, objs, 7, "tok", 3)))["metadata"]
    assert paged == {"resourceVersion": "7", "continue": "tok", "remainingItemCount": 3}


def test_a_custom_resource_is_written_with_sorted_keys_as_kube_writes_unstructured_objects():
    # kube encodes an unstructured object as Go encodes a map: its keys sorted, the list's too. The
    # bytes below are kube-apiserver v1.36's, a LIST and a GET of a CR with only spec (the reference tier
    # compares them live: tests/reference/test_differential.py).
    obj = encode_object(WIDGETS, widget("a"), None)
    item = b'{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{"size":1}}'  # noqa: E501
    assert b"".join(FULL_JSON.object_parts(WIDGETS, obj)) == item
    assert b"".join(FULL_JSON.list_parts(WIDGETS, [obj], 7, None, None)) == (
        b'{"apiVersion":"example.com/v1","items":[' + item + b'],"kind":"WidgetList",'
        b'"metadata":{"continue":"","resourceVersion":"7"}}'
    )
    assert b"".join(FULL_JSON.list_parts(WIDGETS, [], 7, "tok", 3)) == (
        b'{"apiVersion":"example.com/v1","items":[],"kind":"WidgetList",'
        b'"metadata":{"continue":"tok","remainingItemCount":3,"resourceVersion":"7"}}'
    )
    assert FULL_JSON.bookmark_frame(WIDGETS, 9, initial_events_end=True) == (
        b'{"type":"BOOKMARK","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":'
        b'{"annotations":{"k8s.io/initial-events-end":"true"},"resourceVersion":"9"}}}\n'
    )
    # a built-in kind keeps its struct's field order
    assert FULL_JSON.bookmark_frame(PODS, 9, initial_events_end=True).startswith(
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9",'
    )


def test_a_custom_resources_partial_object_metadata_is_a_typed_object_meta():
    # kube converts the unstructured metadata (sorted keys) to a typed ObjectMeta and writes that: its
    # fields, an owner reference's and a managed-fields entry's in their Go structs' order.
    from watchcache.cache.encoding import METADATA_JSON

    obj = widget("a")
    obj["metadata"] = {
        "annotations": {"b": "1"},
        "creationTimestamp": "2026-11-30T21:25:48Z",
        "finalizers": ["example.com/x"],
        "labels": {"a": "2", "z": "1"},
        "managedFields": [{"apiVersion": "example.com/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}},
                           "manager": "kubectl", "operation": "Update", "time": "2026-11-30T21:25:48Z"}],
        "name": "a",
        "namespace": "ns",
        "ownerReferences": [{"apiVersion": "example.com/v1", "blockOwnerDeletion": True, "controller": True,
                             "kind": "Widget", "name": "o", "uid": "u1"}],
        "resourceVersion": "5",
        "uid": "u2",
    }  # fmt: skip
    body = b"".join(METADATA_JSON["v1"].object_parts(WIDGETS, encode_object(WIDGETS, obj)))
    assert body == (
        b'{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"ns",'
        b'"uid":"u2","resourceVersion":"5","creationTimestamp":"2026-11-30T21:25:48Z","labels":{"a":"2","z":"1"},'
        b'"annotations":{"b":"1"},"ownerReferences":[{"apiVersion":"example.com/v1","kind":"Widget","name":"o",'
        b'"uid":"u1","controller":true,"blockOwnerDeletion":true}],"finalizers":["example.com/x"],"managedFields":'
        b'[{"manager":"kubectl","operation":"Update","apiVersion":"example.com/v1","time":"2026-11-30T21:25:48Z",'
        b'"fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}}}]}}'
    )

"""Reading kube's protobuf objects from the wire (kubeproto/objects.py) and the protobuf cache's objects
(cache/protobuf.py), against kube-apiserver's recorded bytes and the JSON of the same objects."""

from __future__ import annotations

from typing import Any

import pytest

from tests.protobuf.recorded import b
from watchcache.cache.encoding import FULL_JSON
from watchcache.cache.object import ObjectError, encode_object
from watchcache.cache.protobuf import FULL_PROTOBUF, ProtobufObject, decode_protobuf_object, protobuf_supported
from watchcache.kubeproto import objects, wire
from watchcache.resources import (
    CONFIGMAPS,
    DEPLOYMENTS,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    ResourceType,
)

RESOURCES = {
    "pods": PODS,
    "configmaps": CONFIGMAPS,
    "secrets": SECRETS,
    "nodes": NODES,
    "namespaces": NAMESPACES,
    "services": SERVICES,
    "serviceaccounts": SERVICEACCOUNTS,
    "deployments": DEPLOYMENTS,
}


def items(entry: dict[str, Any]) -> list[bytes]:
    return objects.list_page(objects.unknown(b(entry["protobuf"])).raw).items


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_attributes_from_the_wire_are_those_of_the_json(record: dict[str, Any], kind: str) -> None:
    """Name, namespace, rv, labels and selectable fields, read from kube's protobuf, equal the JSON's,
    except a false bool the JSON omits: kube's field selectors see "false" (FormatBool)."""
    resource = RESOURCES[kind]
    entry = record["kinds"][kind]
    assert protobuf_supported(resource)
    for raw, doc in zip(items(entry), entry["json"]["items"], strict=True):
        pb = decode_protobuf_object(resource, raw)
        js = encode_object(resource, dict(doc))
        assert (pb.key, pb.namespace, pb.name, pb.rv, pb.labels) == (js.key, js.namespace, js.name, js.rv, js.labels)
        bools = ("spec.hostNetwork", "spec.unschedulable")
        fixed = {f: v or ("false" if f in bools else v) for f, v in js.fields.items()}
        assert pb.fields == fixed
        assert pb.body is raw  # kept as the upstream wrote it


def test_the_selector_leave_deleted_is_the_previous_state_at_the_new_rv(record: dict[str, Any]) -> None:
    """kube's DELETED for p-web-2 leaving app=web: its state at R re-stamped, spliced here byte for byte."""
    (frame,) = [b(f) for f in record["watches"]["client-web-pods"]]
    kind, body = objects.watch_event(frame)
    assert kind == "DELETED"
    new_rv = objects.read_object(objects.unknown(body).raw).resource_version
    before = next(raw for raw in items(record["kinds"]["pods"]) if b"p-web-2" in raw)
    obj = decode_protobuf_object(PODS, before).with_resource_version(int(new_rv))
    assert isinstance(obj, ProtobufObject) and obj.rv == int(new_rv)
    assert FULL_PROTOBUF.build_frame(PODS, obj, "DELETED") == len(frame).to_bytes(4, "big") + frame


def test_initial_parts_are_the_frame_in_pieces(record: dict[str, Any]) -> None:
    obj = decode_protobuf_object(CONFIGMAPS, items(record["kinds"]["configmaps"])[0])
    assert b"".join(FULL_PROTOBUF.initial_parts(CONFIGMAPS, obj)) == FULL_PROTOBUF.build_frame(CONFIGMAPS, obj, "ADDED")
    parts, count = FULL_PROTOBUF.initial_events(CONFIGMAPS, [obj, obj], lambda o: True)
    assert count == 2 and b"".join(parts) == 2 * FULL_PROTOBUF.build_frame(CONFIGMAPS, obj, "ADDED")


def test_a_list_is_kubes_list(record: dict[str, Any]) -> None:
    entry = record["kinds"]["secrets"]
    objs = [decode_protobuf_object(SECRETS, raw) for raw in items(entry)]
    body = b"".join(FULL_PROTOBUF.list_parts(SECRETS, objs, int(record["R"]), None, None))
    assert body == b(entry["protobuf"])


def test_custom_resources_and_unknown_fields_stay_json() -> None:
    widgets = ResourceType("example.com", "v1", "widgets", "Widget", True)
    assert not protobuf_supported(widgets)
    events = ResourceType("", "v1", "events", "Event", True, extra_fields=("involvedObject.kind",))
    assert not protobuf_supported(events)  # no field numbers for its selectable fields here
    assert protobuf_supported(ResourceType("apps", "v1", "replicasets", "ReplicaSet", True))


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a",  # a tag without its length
        b"\x0a\x05abc",  # a length past the end
        b"\x0b\x00",  # a group (wire type 3)
        b"\x08" + b"\xff" * 11,  # an overlong varint
        b"\x0a\x02\x0a\xff",  # metadata whose name runs past it
    ],
)
def test_malformed_bytes_are_refused_not_crashed_on(raw: bytes) -> None:
    with pytest.raises(ObjectError):
        decode_protobuf_object(CONFIGMAPS, raw)


def test_an_object_without_name_or_namespace_is_refused() -> None:
    meta = wire.object_meta({"name": "x"})
    with pytest.raises(ObjectError, match="namespace"):
        decode_protobuf_object(CONFIGMAPS, wire.delimited(1, len(meta)) + meta)
    meta = wire.object_meta({"namespace": "ns"})
    with pytest.raises(ObjectError, match="name"):
        decode_protobuf_object(CONFIGMAPS, wire.delimited(1, len(meta)) + meta)


def test_frames_split_at_any_byte(record: dict[str, Any]) -> None:
    frames = [b(f) for f in record["watches"]["upstream-configmaps"]]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    for cut in range(0, len(stream), 7):
        first, rest = objects.split_frames(stream[:cut])
        second, tail = objects.split_frames(rest + stream[cut:])
        assert first + second == frames and tail == b""


def test_full_json_is_untouched() -> None:
    assert FULL_JSON.name == "json" and FULL_PROTOBUF.content_type == "application/vnd.kubernetes.protobuf"

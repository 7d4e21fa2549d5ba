"""PartialObjectMetadata encodings: bytes equal to kube-apiserver's, derived once per object and event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.support.factories import configmap, pod
from watchcache import apierrors
from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF
from watchcache.cache.events import DELETED, MODIFIED, WatchEvent
from watchcache.cache.metadata import metadata_json, metadata_protobuf
from watchcache.cache.object import encode_object
from watchcache.kubeproto import meta_pb2
from watchcache.resources import CONFIGMAPS, PODS

ROOT = Path(__file__).resolve().parents[2]

# A ConfigMap as a real kube-apiserver v1.36 returned it (JSON), and its PartialObjectMetadata
# in protobuf as the same apiserver returned it for
# Accept: application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1
KUBE_JSON = (
    b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm1","namespace":"negotiation",'
    b'"uid":"351eeecb-ad4b-43fd-889d-c6f6daf00fe7","resourceVersion":"380","creationTimestamp":"2026-11-23T20:57:45Z",'
    b'"labels":{"a":"b"},"managedFields":[{"manager":"probe","operation":"Update","apiVersion":"v1",'
    b'"time":"2026-11-23T20:57:45Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}},'
    b'"f:metadata":{"f:labels":{".":{},"f:a":{}}}}}]},"data":{"k":"v"}}'
)
KUBE_PROTOBUF = (
    b"k8s\x00\n'\n\x0emeta.k8s.io/v1\x12\x15PartialObjectMetadata\x12\xd0\x01\n\xcd\x01\n\x03cm1\x12\x00"
    b'\x1a\x0bnegotiation"\x00*$351eeecb-ad4b-43fd-889d-c6f6daf00fe72\x033808\x00B\x08\x08\xc9\xd1\x92\xd8'
    b'\x06\x10\x00Z\x06\n\x01a\x12\x01b\x8a\x01u\n\x05probe\x12\x06Update\x1a\x02v1"\x08\x08\xc9\xd1\x92\xd8'
    b'\x06\x10\x002\x08FieldsV1:J\nH{"f:data":{".":{},"f:k":{}},"f:metadata":{"f:labels":{".":{},"f:a":{}}}}'
    b'B\x00\x1a\x00"\x00'
)
# The initial-events-end BOOKMARK of a protobuf metadata watch, from the same apiserver.
KUBE_BOOKMARK_FRAME = (
    b"\x00\x00\x00y\n\x08BOOKMARK\x12m\nkk8s\x00\n'\n\x0emeta.k8s.io/v1\x12\x15PartialObjectMetadata\x128\n6"
    b'\n\x00\x12\x00\x1a\x00"\x00*\x002\x034038\x00B\x00b!\n\x19k8s.io/initial-events-end\x12\x04true\x1a\x00"\x00'
)


def kube_configmap():
    return encode_object(CONFIGMAPS, orjson.loads(KUBE_JSON))


def test_protobuf_metadata_is_byte_for_byte_kubes():
    obj = kube_configmap()
    assert b"".join(METADATA_PROTOBUF["v1"].object_parts(CONFIGMAPS, obj)) == KUBE_PROTOBUF


def test_protobuf_bookmark_is_byte_for_byte_kubes():
    frame = METADATA_PROTOBUF["v1"].bookmark_frame(CONFIGMAPS, 403, initial_events_end=True)
    assert frame == KUBE_BOOKMARK_FRAME


def test_json_metadata_is_the_objects_metadata_without_a_copy():
    obj = kube_configmap()
    body = b"".join(METADATA_JSON["v1"].object_parts(CONFIGMAPS, obj))
    expected = orjson.loads(KUBE_JSON)["metadata"]
    assert orjson.loads(body) == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": expected}
    assert isinstance(obj.meta_json, int)  # where the metadata ends in the body: no bytes kept
    # metadata that is not the body's first field is kept as its own bytes
    other = encode_object(
        CONFIGMAPS, {"data": {"k": "v"}, "metadata": {"name": "x", "namespace": "n", "resourceVersion": "1"}}
    )
    assert orjson.loads(metadata_json(other)) == {"name": "x", "namespace": "n", "resourceVersion": "1"}
    assert isinstance(other.meta_json, bytes)


def test_metadata_is_derived_once_per_object(monkeypatch):
    import watchcache.cache.metadata as m

    calls = []
    real = m._metadata_of
    monkeypatch.setattr(
        m, "_metadata_of", lambda obj, resource, decoded=None: calls.append(obj) or real(obj, resource, decoded)
    )
    obj = pod("a", "ns")
    for _ in range(3):
        metadata_json(obj)
        metadata_protobuf(obj)
    assert len(calls) == 2  # one per form


def test_lists_in_every_encoding():
    items = [pod("a", "ns", 3), pod("b", "ns", 4)]
    full = orjson.loads(b"".join(FULL_JSON.list_parts(PODS, items, 9, "tok", 5)))
    assert full["kind"] == "PodList" and full["metadata"] == {
        "resourceVersion": "9",
        "continue": "tok",
        "remainingItemCount": 5,
    }
    meta = orjson.loads(b"".join(METADATA_JSON["v1beta1"].list_parts(PODS, items, 9, None, None)))
    assert meta["kind"] == "PartialObjectMetadataList" and meta["apiVersion"] == "meta.k8s.io/v1beta1"
    assert [i["metadata"]["name"] for i in meta["items"]] == ["a", "b"]
    assert {i["kind"] for i in meta["items"]} == {"PartialObjectMetadata"}
    # kube's empty PartialObjectMetadataList has a nil slice of items: null (its typed lists have []).
    assert orjson.loads(b"".join(METADATA_JSON["v1"].list_parts(PODS, [], 9, None, None)))["items"] is None

    body = b"".join(METADATA_PROTOBUF["v1"].list_parts(PODS, items, 9, "tok", 5))
    assert body.startswith(b"k8s\x00")
    unknown = meta_pb2.Unknown.FromString(body[4:])
    assert (unknown.typeMeta.apiVersion, unknown.typeMeta.kind) == ("meta.k8s.io/v1", "PartialObjectMetadataList")
    decoded = meta_pb2.PartialObjectMetadataList.FromString(unknown.raw)
    assert decoded.metadata.resourceVersion == "9" and getattr(decoded.metadata, "continue") == "tok"
    assert decoded.metadata.remainingItemCount == 5
    assert [i.metadata.name for i in decoded.items] == ["a", "b"]
    assert [i.metadata.resourceVersion for i in decoded.items] == ["3", "4"]


def decode_pb_frames(stream: bytes) -> list[tuple[str, meta_pb2.Unknown]]:
    out = []
    while stream:
        size = int.from_bytes(stream[:4], "big")
        event = meta_pb2.WatchEvent.FromString(stream[4 : 4 + size])
        stream = stream[4 + size :]
        assert event.object.raw.startswith(b"k8s\x00")
        out.append((event.type, meta_pb2.Unknown.FromString(event.object.raw[4:])))
    return out


def test_event_frames_are_built_once_per_event_and_encoding():
    prev, cur = configmap("a", "ns", 5, labels={"x": "1"}), configmap("a", "ns", 6, labels={"x": "2"})
    event = WatchEvent(CONFIGMAPS, MODIFIED, cur, prev, 6, 0.0)
    enc = METADATA_PROTOBUF["v1"]
    frame = enc.event_frame(event, MODIFIED)
    assert enc.event_frame(event, MODIFIED) is frame
    assert METADATA_JSON["v1"].event_frame(event, MODIFIED) is not frame
    assert FULL_JSON.event_frame(event, MODIFIED) is event.frame(MODIFIED)
    [(kind, unknown)] = decode_pb_frames(frame)
    assert kind == "MODIFIED" and unknown.typeMeta.kind == "PartialObjectMetadata"
    # A selector-leave DELETED carries the previous state at the new rv, in every encoding.
    deleted = orjson.loads(METADATA_JSON["v1"].event_frame(event, DELETED))
    assert deleted["type"] == "DELETED"
    assert deleted["object"]["metadata"]["labels"] == {"x": "1"}
    assert deleted["object"]["metadata"]["resourceVersion"] == "6"
    [(kind, unknown)] = decode_pb_frames(enc.event_frame(event, DELETED))
    om = meta_pb2.PartialObjectMetadata.FromString(unknown.raw).metadata
    assert (kind, dict(om.labels), om.resourceVersion) == ("DELETED", {"x": "1"}, "6")
    assert orjson.loads(event.frame(DELETED))["object"]["metadata"]["resourceVersion"] == "6"


def test_error_frames():
    err = apierrors.resource_expired("too old resource version: 1 (5)")
    assert orjson.loads(METADATA_JSON["v1"].error_frame(err))["object"]["code"] == 410
    [(kind, unknown)] = decode_pb_frames(METADATA_PROTOBUF["v1"].error_frame(err))
    status = meta_pb2.Status.FromString(unknown.raw)
    assert (kind, unknown.typeMeta.kind, status.code, status.reason) == ("ERROR", "Status", 410, "Expired")


def test_generated_module_matches_the_proto(tmp_path):
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            str(ROOT / "watchcache/kubeproto/meta.proto"),
        ],
        check=True,
    )  # fmt: skip
    for name in ("meta_pb2.py", "meta_pb2.pyi"):
        fresh = (tmp_path / "watchcache/kubeproto" / name).read_text()
        assert fresh == (ROOT / "watchcache/kubeproto" / name).read_text(), f"{name} is stale: run `make proto`"


def test_metadata_drops_the_annotations_kubes_internal_conversion_moves():
    """kube writes PartialObjectMetadata from its internal object: a DaemonSet's template generation
    and a Deployment's (non-empty) rollback revision are fields there, not annotations."""
    from watchcache.resources import ResourceType

    daemonsets = ResourceType("apps", "v1", "daemonsets", "DaemonSet", True)
    deployments = ResourceType("apps", "v1", "deployments", "Deployment", True)
    moved = {"deprecated.daemonset.template.generation": "2", "keep": "x"}
    ds = encode_object(daemonsets, {"metadata": {"name": "d", "namespace": "n", "resourceVersion": "3",
                                                 "annotations": moved}})  # fmt: skip
    assert orjson.loads(metadata_json(ds, daemonsets))["annotations"] == {"keep": "x"}
    assert wire_annotations(metadata_protobuf(ds, daemonsets)) == {"keep": "x"}
    only = {"deprecated.daemonset.template.generation": "1"}
    ds = encode_object(daemonsets, {"metadata": {"name": "d", "namespace": "n", "resourceVersion": "3",
                                                 "annotations": only}})  # fmt: skip
    assert "annotations" not in orjson.loads(metadata_json(ds, daemonsets))
    for value, kept in (("4", {}), ("", {"deprecated.deployment.rollback.to": ""})):
        annotations = {"deprecated.deployment.rollback.to": value}
        d = encode_object(deployments, {"metadata": {"name": "d", "namespace": "n", "resourceVersion": "3",
                                                     "annotations": annotations}})  # fmt: skip
        assert orjson.loads(metadata_json(d, deployments)).get("annotations", {}) == kept
    # the same annotation on another kind is the user's own
    cm = encode_object(CONFIGMAPS, {"metadata": {"name": "c", "namespace": "n", "resourceVersion": "3",
                                                 "annotations": only}})  # fmt: skip
    assert orjson.loads(metadata_json(cm, CONFIGMAPS))["annotations"] == only


def wire_annotations(om: bytes) -> dict[str, str]:
    from watchcache.kubeproto import meta_pb2

    msg = meta_pb2.ObjectMeta()
    msg.ParseFromString(om)
    return dict(msg.annotations)


def test_a_json_bookmark_carries_the_kinds_zero_values_as_kubes():
    # kube-apiserver v1.36's initial-events-end bookmark of a pod watch-list, and of a ConfigMap's (no
    # field of a ConfigMap is written when zero); cache/zeros.py holds the bytes kube writes per kind.
    from watchcache.cache.zeros import BOOKMARK_TAILS
    from watchcache.resources import DEPLOYMENTS, NODES

    assert FULL_JSON.bookmark_frame(PODS, 402, initial_events_end=True) == (
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"402",'
        b'"annotations":{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}}\n'
    )
    assert FULL_JSON.bookmark_frame(CONFIGMAPS, 402) == (
        b'{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"402"}}}\n'
    )
    # every tail is JSON that continues an object, for the kinds the proxy caches by default among others
    for resource in (PODS, NODES, DEPLOYMENTS):
        assert (resource.group, resource.version, resource.kind) in BOOKMARK_TAILS
    for tail in BOOKMARK_TAILS.values():
        assert tail.startswith(b',"') and isinstance(orjson.loads(b"{" + tail[1:] + b"}"), dict)

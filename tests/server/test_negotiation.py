"""Accept negotiation by kube-apiserver's rules (each expectation checked against a real v1.36 apiserver)."""

from __future__ import annotations

import orjson
import pytest

from watchcache import apierrors
from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF
from watchcache.kubeproto import meta_pb2
from watchcache.resources import CONFIGMAPS, DEPLOYMENTS, ResourceType
from watchcache.server.negotiation import (
    JSON,
    KUBE,
    PROTOBUF,
    SIM,
    YAML,
    Negotiated,
    NotAcceptable,
    PassReason,
    ProtobufRequest,
    TableRequest,
    choose,
    error_encoding,
    negotiate,
    parse_accept,
    render_error,
)

META_LIST = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
META = (
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)
KUBECTL = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
TYPED = "application/vnd.kubernetes.protobuf, */*"


def test_parse_accept_orders_by_q_then_concrete_before_wildcard():
    ranges = parse_accept("*/*;q=0.8, text/plain;q=0.5, application/json, application/*;q=0.9")
    assert [(r.type, r.subtype) for r in ranges] == [
        ("application", "json"),
        ("application", "*"),
        ("text", "plain"),  # goautoneg: a concrete type sorts before */* even at a lower q
        ("*", "*"),
    ]


def test_parse_accept_skips_malformed_ranges_and_keeps_params():
    ranges = parse_accept("json, a/b/c, application/json;as=Table;g=meta.k8s.io;v=v1;bad;x=1=2, *")
    assert [(r.type, r.subtype) for r in ranges] == [("application", "json"), ("*", "*")]
    assert ranges[0].params == (("as", "Table"), ("g", "meta.k8s.io"), ("v", "v1"))


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, Negotiated(JSON)),
        ("", Negotiated(JSON)),
        ("*/*", Negotiated(JSON)),
        ("application/json;q=0", Negotiated(JSON)),  # q=0 does not exclude (goautoneg)
        ("application/json;sv=v1", Negotiated(JSON)),
        ("application/json;stream=watch", Negotiated(JSON)),
        ("application/yaml", Negotiated(YAML)),
        (TYPED, Negotiated(PROTOBUF)),
        (META_LIST, Negotiated(PROTOBUF, "PartialObjectMetadataList", "v1")),
        (
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
            Negotiated(JSON, "PartialObjectMetadata", "v1beta1"),
        ),
        (KUBECTL, Negotiated(JSON, "Table", "v1")),
        # an unknown version of a conversion skips that range; the next one is taken
        ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2,application/json", Negotiated(JSON)),
    ],
)
def test_negotiate_picks_what_kube_picks(accept, expected):
    assert negotiate(accept, KUBE, collection=True) == expected


@pytest.mark.parametrize(
    ("accept", "router"),
    [
        ("text/html", True),
        ("application/*", True),  # layer 2 would take it, go-restful's route match does not
        ("application/JSON", True),
        ("foo", True),
        ("application/json;as=PartialObjectMetadata", False),  # no g/v
        ("application/json;as=Foo;g=meta.k8s.io;v=v1", False),
        ("application/json;stream=foo", False),
        ("application/json;sv=v2", False),
        ("application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1", False),  # no protobuf Table
    ],
)
def test_not_acceptable_as_kube_words_it(accept, router):
    with pytest.raises(NotAcceptable) as caught:
        negotiate(accept, KUBE, collection=False)
    status = orjson.loads(caught.value.body())
    assert status["code"] == 406 and status["reason"] == "NotAcceptable"
    if router:
        assert status["message"] == (
            "406: Not Acceptable\n\nAvailable representations: "
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
        )
        assert status["details"] == {}
    else:
        assert status["message"] == (
            "only the following media types are accepted: "
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
        )
        assert "details" not in status


def test_a_collection_route_also_lists_the_stream_types():
    with pytest.raises(NotAcceptable) as caught:
        negotiate("text/html", KUBE, collection=True)
    assert caught.value.message.endswith(
        "application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
    )


def test_the_406_body_is_pretty_json_when_the_client_accepts_no_json():
    with pytest.raises(NotAcceptable) as caught:
        negotiate("text/html", KUBE, collection=False)
    assert caught.value.body().startswith(b'{\n  "kind": "Status"')
    with pytest.raises(NotAcceptable) as caught:
        negotiate("application/*", KUBE, collection=False)  # the error itself negotiates JSON
    assert caught.value.body().startswith(b'{"kind":"Status"')


def test_error_encoding_ignores_conversions():
    assert error_encoding(META_LIST) == JSON
    assert error_encoding(TYPED) == PROTOBUF
    assert error_encoding("application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1") is None


def test_a_protobuf_client_gets_its_errors_in_protobuf():
    err = render_error(apierrors.not_found("", "configmaps", "x"), TYPED, KUBE)
    assert err.content_type == PROTOBUF
    body = err.body()
    assert body.startswith(b"k8s\x00")
    unknown = meta_pb2.Unknown.FromString(body[4:])
    status = meta_pb2.Status.FromString(unknown.raw)
    assert (unknown.typeMeta.kind, status.code, status.reason) == ("Status", 404, "NotFound")
    assert render_error(apierrors.not_found("", "configmaps", "x"), META_LIST, KUBE).content_type == JSON


@pytest.mark.parametrize(
    ("accept", "verb", "expected"),
    [
        (None, "list", FULL_JSON),
        ("application/json", "watch", FULL_JSON),
        # protobuf preferred, JSON accepted: protobuf from the protobuf cache when it is ready, else JSON
        (TYPED, "list", ProtobufRequest(FULL_JSON)),
        (TYPED, "watch", ProtobufRequest(FULL_JSON)),
        (META_LIST, "list", METADATA_PROTOBUF["v1"]),
        (META, "watch", METADATA_PROTOBUF["v1"]),
        (META, "get", METADATA_PROTOBUF["v1"]),
        (META.split(",", 1)[1], "watch", METADATA_JSON["v1"]),
        ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", "list", METADATA_JSON["v1beta1"]),
        (KUBECTL, "list", TableRequest("v1")),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", "watch", TableRequest("v1beta1")),
        ("application/yaml;as=Table;v=v1;g=meta.k8s.io", "list", PassReason.MEDIA_TYPE),
        ("application/yaml", "get", PassReason.MEDIA_TYPE),
        ("application/vnd.kubernetes.protobuf", "list", ProtobufRequest(PassReason.PROTOBUF)),
        ("application/vnd.kubernetes.protobuf;stream=watch", "watch", ProtobufRequest(PassReason.PROTOBUF)),
        (f"application/vnd.kubernetes.protobuf, {KUBECTL}", "list", ProtobufRequest(TableRequest("v1"))),
        (META_LIST, "get", PassReason.MEDIA_TYPE),  # kube's answer comes after reading: let it give it
        (META, "list", PassReason.MEDIA_TYPE),
        (META_LIST, "watch", PassReason.MEDIA_TYPE),
    ],
)
def test_choose_in_front_of_kube(accept, verb, expected):
    assert choose(accept, KUBE, verb, CONFIGMAPS) == expected


def test_a_custom_resource_is_never_asked_of_the_protobuf_cache():
    widgets = ResourceType("example.com", "v1", "widgets", "Widget", True)
    assert choose(TYPED, KUBE, "list", widgets) is FULL_JSON
    assert choose("application/vnd.kubernetes.protobuf", KUBE, "get", widgets) == PassReason.PROTOBUF


def test_the_sim_negotiates_only_what_it_writes():
    assert choose(KUBECTL, SIM, "list", CONFIGMAPS) == TableRequest("v1")  # the proxy's printers
    assert choose(TYPED, SIM, "list", CONFIGMAPS) is FULL_JSON
    with pytest.raises(NotAcceptable) as caught:
        choose("application/vnd.kubernetes.protobuf", SIM, "list", CONFIGMAPS)
    # kube's words for a kind it cannot write in protobuf (a custom resource's 406, recorded from
    # kube-apiserver: tests/server/fixtures/protobuf-refused.bin), in protobuf as kube writes it
    assert caught.value.message == (
        "only the following media types are accepted: "
        "application/json, application/yaml, application/vnd.kubernetes.protobuf"
    )
    assert caught.value.content_type == PROTOBUF
    with pytest.raises(NotAcceptable) as caught:
        choose(META_LIST, SIM, "get", CONFIGMAPS)
    assert caught.value.message == (
        "you requested PartialObjectMetadataList, but the requested object is not a list (*core.ConfigMap)"
    )
    with pytest.raises(NotAcceptable) as caught:
        choose(META, SIM, "list", DEPLOYMENTS)
    assert caught.value.message == (
        "you requested PartialObjectMetadata, but the requested object is a list (*apps.DeploymentList)"
    )

"""Content negotiation of a cached read, by kube-apiserver's rules.

kube-apiserver answers an ``Accept`` header in two layers, and so does this module:

1. the router (go-restful) keeps the route only if some media range, parameters
   stripped, is ``*/*`` or exactly a media type the route produces; otherwise
   ``406 "406: Not Acceptable\\n\\nAvailable representations: ..."`` (with empty details);
2. the handler (``negotiation.NegotiateMediaTypeOptions``) walks the media ranges in
   goautoneg's order (by q, then concrete before wildcard) and, for each, the server's
   serializers in order (json, yaml, protobuf); the first (range, serializer) whose
   parameters the endpoint allows wins: ``as``/``g``/``v`` ask for a conversion
   (``PartialObjectMetadata``, ``PartialObjectMetadataList`` or ``Table`` of
   ``meta.k8s.io`` ``v1``/``v1beta1``), ``stream`` must be ``watch`` on a serializer that
   streams, ``sv`` must be ``v1``; unknown parameters are ignored. Nothing allowed:
   ``406 "only the following media types are accepted: ..."``.

The outcome is kube's choice, whether or not the cache can produce it: the handler then
serves it from the cache or passes the request through (``Negotiated.pass_reason``).
Quirks are kept on purpose (``q=0`` still accepts; ``application/*`` passes layer 2
but not layer 1; media types are case-sensitive), because clients see kube's answers.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from watchcache.apierrors import StatusError
from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF, Encoding
from watchcache.kubeproto import wire
from watchcache.quoting import go_json_escape
from watchcache.resources import ResourceType
from watchcache.server.pretty import accepts_pretty, wants_pretty

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
STREAM_TYPES = (JSON + ";stream=watch", PROTOBUF + ";stream=watch")

META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
METADATA = "PartialObjectMetadata"
METADATA_LIST = "PartialObjectMetadataList"
TABLE = "Table"


class PassReason(enum.StrEnum):
    """Why a request goes to the upstream instead of the cache: a small fixed set (a metric label)."""

    NON_RESOURCE = "non-resource"
    IMPERSONATION = "impersonation"
    WRITE = "write"
    SUBRESOURCE = "subresource"
    UNCACHED_RESOURCE = "uncached-resource"
    TABLE = "table"  # a kind without a printer here, or an object its printer cannot print as kube
    TABLE_CRD = "table-crd"  # a custom resource whose CRD (printer columns) this server does not hold
    PROTOBUF = "protobuf"
    MEDIA_TYPE = "media-type"
    CONSISTENT_READ = "consistent-read"  # a consistent LIST or watch whose scope could not be proven fresh
    CONSISTENT_GET = "consistent-get"  # a GET without resourceVersion: kube-apiserver reads it from etcd too
    UPSTREAM_CONTINUE = "upstream-continue"  # the next page of a list the upstream answered
    FIELD_SELECTOR = "field-selector"  # a custom resource's field only its CRD knows (selectableFields)
    UPGRADE = "upgrade"
    OLD_EXACT_READ = "old-exact-read"  # an Exact LIST older than the history window (kube reads etcd)
    UNREACHED_RV = "unreached-rv"  # a GET or LIST at an rv the cache did not reach within --fresh-wait
    NON_CANONICAL = "non-canonical"  # a path or query kube reads otherwise than the cache would (http/routing.py)


@dataclass(frozen=True)
class Endpoint:
    """What the server behind this handler negotiates: its serializers, in preference order."""

    media_types: tuple[str, ...]
    # A TableConvertor: kube-apiserver has one for every resource (and so do the proxy's printers).
    table: bool
    # Full objects in protobuf (the simulated cluster has no schemas: metadata only).
    full_protobuf: bool
    # An upstream answers what the cache cannot produce (else this server answers 406 itself).
    passes_through: bool
    # The media types a handler's 406 names ("only the following media types are accepted"):
    # kube names all its serializers, also for a kind it cannot write in protobuf (a custom resource).
    accepted: tuple[str, ...] = (JSON, YAML, PROTOBUF)


# A kube-apiserver: the proxy negotiates as it would, then serves what the cache can produce.
KUBE = Endpoint((JSON, YAML, PROTOBUF), table=True, full_protobuf=True, passes_through=True)
# The simulated cluster (and the proxy on its embedded one): only what the cache can produce. It has
# no schemas to write full objects in protobuf, and refuses them as kube refuses a custom resource's.
SIM = Endpoint((JSON, PROTOBUF), table=True, full_protobuf=False, passes_through=False)


@dataclass(frozen=True, slots=True)
class MediaRange:
    type: str
    subtype: str
    q: float
    params: tuple[tuple[str, str], ...]


def parse_accept(header: str) -> list[MediaRange]:
    """The media ranges of ``header`` in the order kube tries them (goautoneg ``ParseAccept``).

    Malformed ranges are skipped, ``q`` is parsed (0 on error) but never excludes a range, and
    the sort is goautoneg's comparison applied as an insertion sort, which is what Go's
    ``sort.Sort`` does for the few ranges a real header has.
    """
    out: list[MediaRange] = []
    for part in header.split(","):
        part = part.strip(" ")
        if not part:
            continue
        media, _, rest = part.partition(";")
        main, slash, sub = media.partition("/")
        main = main.strip(" ")
        if not slash:
            if main != "*":
                continue
            sub = "*"
        elif "/" in sub:
            continue
        q = 1.0
        params: list[tuple[str, str]] = []
        if rest:
            for item in rest.split(";"):
                key, eq, value = item.partition("=")
                if not eq or "=" in value:
                    continue
                key = key.strip(" ")
                if key == "q":
                    # Go's ParseFloat: no surrounding space, and an error reads as 0
                    try:
                        q = float(value) if value == value.strip() else 0.0
                    except ValueError:
                        q = 0.0
                else:
                    params.append((key, value.strip(" ")))
        out.append(MediaRange(main, sub.strip(" "), q, tuple(params)))
    for i in range(1, len(out)):
        j = i
        while j > 0 and _before(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


def _before(a: MediaRange, b: MediaRange) -> bool:
    # goautoneg's Less, quirks included (a concrete type sorts before a wildcard even at lower q).
    if a.q > b.q:
        return True
    if a.type != "*" and b.type == "*":
        return True
    return a.subtype != "*" and b.subtype == "*"


@dataclass(frozen=True, slots=True)
class TableRequest:
    """kube would answer with a Table of ``meta.k8s.io/<version>`` (``server/tables.py`` prints it)."""

    version: str


@dataclass(frozen=True, slots=True)
class ProtobufRequest:
    """kube would answer with full objects in protobuf: from the resource's protobuf cache if it is
    ready, else ``fallback`` (an encoding the cache writes, or why the request passes through)."""

    fallback: Encoding | TableRequest | PassReason


@dataclass(frozen=True, slots=True)
class Negotiated:
    """kube's choice for a request: a media type and, for a conversion, the target kind and version."""

    media_type: str
    kind: str = ""  # "" (the object itself), PartialObjectMetadata(List) or Table
    version: str = ""  # of meta.k8s.io, for a conversion
    pretty: bool = False  # the media type's ``pretty=1`` parameter (server/pretty.py)


class EncodedStatus(StatusError):
    """A Status written as kube writes errors for the request's Accept header.

    kube negotiates an error's encoding without conversions: protobuf for a client whose first
    acceptable plain type is protobuf, pretty-printed JSON when nothing is acceptable or the request
    asks for it (``media`` None), compact JSON otherwise.
    """

    def __init__(self, err: StatusError, media: str | None) -> None:
        super().__init__(err.code, err.reason, err.message, details=err.details, list_continue=err.list_continue)
        self.retry_after = err.retry_after
        self.media = media
        self.content_type = PROTOBUF if media == PROTOBUF else JSON

    def body(self) -> bytes:
        if self.media == PROTOBUF:
            return wire.status_body(self.to_status())
        if self.media is None:
            return go_json_escape(orjson.dumps(self.to_status(), option=orjson.OPT_INDENT_2))
        return super().body()


class NotAcceptable(EncodedStatus):
    """406 with the body kube-apiserver writes (``router``: go-restful's, which has empty details)."""

    def __init__(self, message: str, *, router: bool, media: str | None) -> None:
        super().__init__(StatusError(406, "NotAcceptable", message), media)
        self.router = router

    def to_status(self) -> dict[str, Any]:
        status = super().to_status()
        if self.router:
            # go-restful's errors become a generic server response, which carries empty details.
            status = {**{k: v for k, v in status.items() if k != "code"}, "details": {}, "code": self.code}
        return status


def _allowed(
    endpoint: Endpoint, media_type: str, params: tuple[tuple[str, str], ...], *, restricted: bool
) -> Negotiated | None:
    """kube's ``acceptMediaTypeOptions`` + the endpoint's ``AllowsMediaTypeTransform``."""
    kind = group = version = None
    pretty = False
    for key, value in params:
        if key == "pretty":
            pretty = value == "1"
        elif key == "as":
            kind = value
        elif key == "g":
            group = value
        elif key == "v":
            version = value
        elif value and (
            # only watch streams, and only on a serializer that streams (not yaml)
            (key == "stream" and (media_type == YAML or value != "watch"))
            # a server version other than meta's (refused outright for errors)
            or (key == "sv" and (restricted or value != "v1"))
        ):
            return None
    if kind is None and group is None and version is None:
        if media_type == PROTOBUF and not endpoint.full_protobuf and not restricted:
            return None
        return Negotiated(media_type, pretty=pretty)
    if restricted or group != META_GROUP or version not in META_VERSIONS:
        return None
    if kind == TABLE:
        if not endpoint.table or media_type == PROTOBUF:
            return None
    elif kind not in (METADATA, METADATA_LIST):
        return None
    return Negotiated(media_type, kind or "", version or "", pretty)


def _negotiate(header: str, endpoint: Endpoint, *, restricted: bool = False) -> Negotiated | None:
    if not header:
        return Negotiated(endpoint.media_types[0])
    for clause in parse_accept(header):
        for media_type in endpoint.media_types:
            main, _, sub = media_type.partition("/")
            if (clause.type == "*" and clause.subtype == "*") or (clause.type == main and clause.subtype in (sub, "*")):
                chosen = _allowed(endpoint, media_type, clause.params, restricted=restricted)
                if chosen is not None:
                    return chosen
    return None


def _router_accepts(header: str, produces: tuple[str, ...]) -> bool:
    for item in header.split(","):
        media = item.split(";", 1)[0].strip(" ")
        if media == "*/*" or media in produces:
            return True
    return False


def error_encoding(header: str, endpoint: Endpoint = KUBE) -> str | None:
    """The media type kube writes an error Status in for this Accept (no conversions allowed), or None:
    then kube falls back to pretty-printed JSON."""
    chosen = _negotiate(header, endpoint, restricted=True)
    return None if chosen is None else chosen.media_type


def negotiate(header: str | None, endpoint: Endpoint, *, collection: bool) -> Negotiated:
    """kube's choice for a read with this Accept header; raises ``NotAcceptable`` (406) as kube does.

    ``collection``: a LIST/WATCH route (which also produces the ``;stream=watch`` types) rather
    than a single object's GET route.
    """
    header = header or ""
    produces = endpoint.media_types + (STREAM_TYPES if collection else ())
    if header and not _router_accepts(header, produces):
        message = "406: Not Acceptable\n\nAvailable representations: " + ", ".join(produces)
        raise NotAcceptable(message, router=True, media=error_encoding(header, endpoint))
    chosen = _negotiate(header, endpoint)
    if chosen is None:
        message = "only the following media types are accepted: " + ", ".join(endpoint.accepted)
        raise NotAcceptable(message, router=False, media=error_encoding(header, endpoint))
    return chosen


def pretty_requested(query: Mapping[str, list[str]], headers: Mapping[str, str], endpoint: Endpoint) -> bool:
    """A JSON answer to this request is indented (kube's ``mediaType.Pretty || isPrettyPrint(req)``)."""
    if wants_pretty(query, headers):
        return True
    header = headers.get("accept")
    if not accepts_pretty(header):
        return False
    chosen = _negotiate(header or "", endpoint)
    return chosen is not None and chosen.pretty


def render_error(err: StatusError, header: str | None, endpoint: Endpoint, *, pretty: bool = False) -> StatusError:
    """``err`` in the encoding kube would write it in for this Accept header; ``pretty``: the request
    asks for indented JSON (``pretty_requested``), which a JSON error then is."""
    if isinstance(err, EncodedStatus):
        return err
    media = error_encoding(header, endpoint) if header else JSON
    if media in (JSON, YAML):  # YAML: the cache writes no YAML; JSON is what every client decodes
        return EncodedStatus(err, None) if pretty else err
    return EncodedStatus(err, media)


def _go_type(resource: ResourceType, is_list: bool) -> str:
    """The internal Go type kube names in conversion errors (built-in kinds)."""
    package = "core" if resource.group in ("", "events.k8s.io") else resource.group.split(".")[0]
    return f"*{package}.{resource.kind}{'List' if is_list else ''}"


def choose(
    header: str | None, endpoint: Endpoint, verb: str, resource: ResourceType
) -> Encoding | TableRequest | ProtobufRequest | PassReason:
    """How a cached read (``verb`` get, list or watch) is answered: an encoding, a Table, or why it goes upstream.

    Raises ``NotAcceptable`` where kube would answer 406 itself, before reading anything.
    """
    if header and endpoint.passes_through and resource.custom:
        produces = endpoint.media_types + STREAM_TYPES
        if not _router_accepts(header, produces):
            return PassReason.MEDIA_TYPE  # a custom resource has no router layer, an aggregated API has one
    chosen = negotiate(header, endpoint, collection=verb != "get")
    if chosen.media_type == PROTOBUF and not chosen.kind:
        # Full objects in protobuf: the upstream's own bytes, from the resource's protobuf cache
        # when it has one (server/app.py). Until then, a client that also accepts something the
        # cache writes gets that (JSON for client-go's default "protobuf, */*"), as a server
        # without a protobuf serializer would answer it; one that accepts only protobuf passes through.
        fallback = _negotiate(header or "", dataclasses.replace(endpoint, full_protobuf=False))
        otherwise = PassReason.PROTOBUF if fallback is None else _answer(fallback, header, endpoint, verb, resource)
        if resource.custom:
            return otherwise
        return ProtobufRequest(otherwise)
    return _answer(chosen, header, endpoint, verb, resource)


def _answer(
    chosen: Negotiated, header: str | None, endpoint: Endpoint, verb: str, resource: ResourceType
) -> Encoding | TableRequest | PassReason:
    if chosen.media_type == YAML:
        return PassReason.MEDIA_TYPE
    if chosen.kind == TABLE:
        return TableRequest(chosen.version)
    if not chosen.kind:
        return FULL_JSON
    wanted = METADATA_LIST if verb == "list" else METADATA
    if chosen.kind != wanted:
        # kube answers these after reading (406 for built-in kinds, 500 for custom resources, an
        # empty 200 for a watch): the upstream's answer is the exact one.
        if endpoint.passes_through:
            return PassReason.MEDIA_TYPE
        if chosen.kind == METADATA_LIST:
            message = (
                f"you requested {METADATA_LIST}, but the requested object is not a list ({_go_type(resource, False)})"
            )
        else:
            message = f"you requested {METADATA}, but the requested object is a list ({_go_type(resource, True)})"
        raise NotAcceptable(message, router=False, media=error_encoding(header or "", endpoint))
    return (METADATA_PROTOBUF if chosen.media_type == PROTOBUF else METADATA_JSON)[chosen.version]

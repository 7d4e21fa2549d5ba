"""GET and LIST from the cache over HTTP: parse the request, ask the read's owner, write cached bytes.

What a read waits for and which state it reads is decided below HTTP (``dispatch/reads.py``); its
refusals become a Status or a pass-through here (``server/refusals.py``). Response bodies are
never built as Python objects: a LIST is its envelope plus each item's cached bytes, handed to the
transport as a list of buffers (``writelines``).
"""

from __future__ import annotations

from collections.abc import Sequence

from watchcache import apierrors
from watchcache.cache.continuetoken import UnverifiedContinueToken
from watchcache.cache.encoding import FULL_JSON, JSON, Encoding
from watchcache.cache.semantics import ListOptions, plan_get, plan_list
from watchcache.dispatch import reads
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.lists import list_parts
from watchcache.dispatch.outcomes import Refusal
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.server.context import ApiContext
from watchcache.server.negotiation import PassReason
from watchcache.server.pretty import indent
from watchcache.server.refusals import PassThrough, refuse
from watchcache.server.selection import parse_predicate


async def serve_get(
    ctx: ApiContext,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    response: Response,
    encoding: Encoding = FULL_JSON,
    *,
    headers: Sequence[tuple[str, str]] = (),
    pretty: bool = False,
) -> None:
    """``pretty``: the request asks for indented JSON (``server/pretty.py``)."""
    resource = cacher.resource
    plan = plan_get(opts.resource_version, from_storage=resource.uncached_by_kube)
    obj = await reads.read_object(ctx, cacher, plan, info.namespace, info.name)
    if obj is None:
        raise apierrors.not_found(resource.group, resource.resource, info.name)
    if isinstance(obj, Refusal):
        refuse(obj)
    parts = _answer(encoding.object_parts(resource, obj), encoding, pretty)
    response.send(200, parts, content_type=encoding.content_type, headers=headers)


async def serve_list(
    ctx: ApiContext,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    response: Response,
    encoding: Encoding = FULL_JSON,
    *,
    headers: Sequence[tuple[str, str]] = (),
    pretty: bool = False,
) -> None:
    predicate = parse_predicate(cacher.resource, info.namespace, opts)
    try:
        plan = plan_list(opts, ctx.codec)
    except UnverifiedContinueToken as e:
        if ctx.upstream_continue_tokens:
            # The next page of a list the upstream answered (a consistent read passed through):
            # its token, its to validate, with the client's own credentials.
            raise PassThrough(PassReason.UPSTREAM_CONTINUE) from None
        raise apierrors.bad_request(f"invalid continue token: {e}") from None
    namespace = info.namespace if cacher.resource.namespaced else None
    # One object by name: kube's store reads it as one key (MatchesSingle), in a namespace or of a
    # cluster-scoped kind (an all-namespaces LIST has no key to read).
    single = predicate.exact_name() is not None and (bool(namespace) or not cacher.resource.namespaced)
    snapshot = await reads.list_snapshot(ctx, cacher, plan, namespace, single=single)
    if isinstance(snapshot, Refusal):
        refuse(snapshot)
    # In the step the snapshot was taken in: it cannot change under the answer.
    parts = _answer(
        list_parts(ctx.codec, cacher, snapshot, plan, predicate, info.namespace, opts, encoding), encoding, pretty
    )
    # The parts are immutable cached bytes: the snapshot stays consistent while they are written.
    await response.send_stream(200, parts, content_type=encoding.content_type, headers=headers)


def _answer(parts: Sequence[bytes], encoding: Encoding, pretty: bool) -> Sequence[bytes]:
    """The answer's bytes: the parts and the encoding's end, or the parts indented for a person (JSON
    only, and no end, as kube's pretty answers have none). A new sequence: the parts may be a shared
    answer's."""
    if pretty and encoding.content_type == JSON:
        indented = indent(parts)
        if indented is not None:
            return (indented,)
    return (*parts, encoding.answer_end) if encoding.answer_end else parts

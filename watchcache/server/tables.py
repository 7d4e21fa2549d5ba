"""Table requests (kubectl's default output) from the cache: which printer, which encoding.

kube-apiserver answers ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` with a Table
printed by the resource's TableConvertor. The proxy has the same for the kinds it caches
(``watchcache.printers``): the printers of kube's own kinds, a custom resource's
``additionalPrinterColumns`` (read from the CRD in the cache of
``customresourcedefinitions``: a CRD update gives new columns), and kube's default columns
for the kinds kube registers without a printer. Anything else passes through, counted by
reason: ``table`` (a kind whose printer the proxy does not have, or an object it cannot print
as kube would), ``table-crd`` (a custom resource whose CRD the proxy does not hold, e.g. an
aggregated API).

The read itself is the GET, LIST or WATCH it renders (``reads.py``, ``watch.py``): same
resourceVersion rules, snapshot, paging and selectors; only the encoding differs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from watchcache import apierrors
from watchcache.cache.object import CachedObject
from watchcache.cache.semantics import ListOptions, plan_watch
from watchcache.dispatch.cacher import Cacher
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.printers.crd import CustomPrinter, UnsupportedColumns
from watchcache.printers.kube import DEFAULT, builtin_printer
from watchcache.printers.row import Printer, Unprintable
from watchcache.printers.table import INCLUDE_OBJECT, TableEncoding
from watchcache.quoting import go_quote
from watchcache.resources import ResourceType
from watchcache.server.context import ApiContext
from watchcache.server.negotiation import PassReason
from watchcache.server.reads import serve_get, serve_list
from watchcache.server.refusals import PassThrough
from watchcache.server.selection import parse_predicate
from watchcache.server.watch import HttpWatchStream, serve_watch

log = logging.getLogger("watchcache.server.tables")

CRDS = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CRDS_ID = "apiextensions.k8s.io/v1/customresourcedefinitions"


class _InvalidInclude(TableEncoding):
    """kube reads first and refuses the conversion after: a GET of a missing object is still 404."""

    def __init__(self, message: str, printer: Printer, version: str, clock: Callable[[], int]) -> None:
        super().__init__(printer, version, "Metadata", clock)
        self.error = apierrors.bad_request(message)

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        raise self.error

    def list_parts(
        self, resource: ResourceType, items: Sequence[CachedObject], *args: Any, **kwargs: Any
    ) -> list[bytes]:
        raise self.error


class Tables:
    """The printers and Table encodings of one server, memoized: encodings are shared, so that
    watchers of one Table form one group and share frames."""

    def __init__(self, ctx: ApiContext, *, passes_through: bool, clock: Callable[[], int] = time.time_ns) -> None:
        self.ctx = ctx
        # False (the simulated cluster, which has no upstream to ask): a kind without a printer
        # gets kube's default columns rather than a pass-through.
        self.passes_through = passes_through
        self.clock = clock
        self._encodings: dict[tuple[int, str, str], tuple[Printer, TableEncoding]] = {}
        # CRD name -> (the CRD object read, {version: (columns key, printer or why not)})
        self._crds: dict[str, tuple[CachedObject, dict[str, tuple[bytes, CustomPrinter | str]]]] = {}

    def printer(self, resource: ResourceType) -> Printer | PassReason:
        if not resource.custom:
            printer = builtin_printer(resource.group, resource.resource)
            if printer is not None:
                return printer
            return PassReason.TABLE if self.passes_through else DEFAULT
        return self._custom_printer(resource)

    def crd_cacher(self) -> Cacher | None:
        """The cache of CRDs here (a follower of its owner, made on first use), or None."""
        crds = self.ctx.registry.get(*CRDS)
        if crds is None:
            return None
        cacher = self.ctx.cachers.get(crds)
        if cacher is None and self.ctx.on_demand is not None:
            cacher = self.ctx.on_demand(crds)
        return cacher

    def _crd_cacher(self) -> Cacher | None:
        cacher = self.crd_cacher()
        return cacher if cacher is not None and cacher.ready else None

    def _custom_printer(self, resource: ResourceType) -> Printer | PassReason:
        cacher = self._crd_cacher()
        name = f"{resource.resource}.{resource.group}"
        crd = cacher.cache.get(name) if cacher is not None else None
        if crd is None:
            self._crds.pop(name, None)
            return PassReason.TABLE_CRD
        known = self._crds.get(name)
        if known is None or known[0] is not crd:
            # A new state of the CRD: printers again, kept where the columns did not change.
            previous = known[1] if known is not None else {}
            decoded = orjson.loads(b"{" + crd.body)
            printers = {v: _crd_printer(decoded, v, previous.get(v)) for v in {*previous, resource.version}}
            known = self._crds[name] = (crd, printers)
        entry = known[1].get(resource.version)
        if entry is None:
            entry = known[1][resource.version] = _crd_printer(orjson.loads(b"{" + crd.body), resource.version, None)
        printer = entry[1]
        if isinstance(printer, str):
            return PassReason.TABLE
        return printer

    def encoding(self, printer: Printer, version: str, include: str) -> TableEncoding:
        key = (id(printer), version, include)
        known = self._encodings.get(key)
        if known is not None and known[0] is printer:
            return known[1]
        encoding = TableEncoding(printer, version, include, self.clock)
        self._encodings[key] = (printer, encoding)
        if len(self._encodings) > 1024:  # printers of CRDs that changed since: rebuilt on use
            self._encodings = {key: (printer, encoding)}
        return encoding


def _crd_printer(
    crd: dict[str, Any], version: str, previous: tuple[bytes, CustomPrinter | str] | None
) -> tuple[bytes, CustomPrinter | str]:
    """The printer of ``version`` of ``crd``; the previous one if the columns did not change (its rows stay)."""
    spec = crd.get("spec") or {}
    declared = next((v.get("additionalPrinterColumns") for v in spec.get("versions") or [] if v.get("name") == version),
                    None)  # fmt: skip
    key = orjson.dumps([spec.get("group"), (spec.get("names") or {}).get("kind"), version, declared])
    if previous is not None and previous[0] == key:
        return previous
    try:
        return key, CustomPrinter.from_crd(crd, version)
    except UnsupportedColumns as e:
        log.info("Tables of %s/%s pass through: %s", (crd.get("metadata") or {}).get("name"), version, e)
        return key, str(e)


def include_object(request: Request) -> str | None:
    """``includeObject``, defaulted as kube does (``Metadata``); None if kube refuses it."""
    value = request.query_value("includeObject") or ""
    if value == "":
        return "Metadata"
    return value if value in INCLUDE_OBJECT else None


async def serve_table(
    ctx: ApiContext,
    tables: Tables,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    request: Request,
    response: Response,
    version: str,
    *,
    started: Callable[[], None] | None = None,
    headers: Sequence[tuple[str, str]] = (),
    pretty: bool = False,
) -> HttpWatchStream | None:
    """A GET, LIST or WATCH answered with Tables of ``meta.k8s.io/<version>``; a watch that goes on
    detached from the handler is returned (``serve_watch``). ``pretty``: indented JSON (GET, LIST)."""
    if cacher.resource.custom:
        crds = tables.crd_cacher()
        if crds is not None and not crds.ready:  # a follower of the CRDs' owner, just made
            await crds.wait_ready(ctx.config.fresh_wait)
    printer = tables.printer(cacher.resource)
    if isinstance(printer, PassReason):
        raise PassThrough(printer)
    include = include_object(request)
    encoding: TableEncoding
    if include is None:
        value = request.query_value("includeObject") or ""
        message = (
            f"Unable to convert to Table as requested: includeObject: Invalid value: {go_quote(value)}: "
            "must be 'Metadata', 'Object', 'None', or empty"
        )
        if info.verb == "watch":
            # kube reads the Table's options once the watch is made (optionsForTransform): the
            # selectors' and the options' own errors come first (the session-48 re-probe).
            parse_predicate(cacher.resource, info.namespace, opts)
            plan_watch(opts)
            raise apierrors.bad_request(message)
        encoding = _InvalidInclude(message, printer, version, tables.clock)
    else:
        encoding = tables.encoding(printer, version, include)
    try:
        if info.verb == "watch":
            return await serve_watch(ctx, cacher, info, opts, response, encoding, started=started, headers=headers)
        if info.verb == "get":
            await serve_get(ctx, cacher, info, opts, response, encoding, headers=headers, pretty=pretty)
        else:
            await serve_list(ctx, cacher, info, opts, response, encoding, headers=headers, pretty=pretty)
    except Unprintable as e:
        log.warning("a %s Table passes through: %s", cacher.resource.qualified, e)
        raise PassThrough(PassReason.TABLE) from None
    return None

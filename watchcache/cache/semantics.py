"""The resourceVersion tables of the Kubernetes API, as plans the read path executes.

One function per operation turns request options into a ``ReadPlan`` (or a
``WatchPlan``) naming the semantic of the reference's table cell — Most Recent, Any,
Not older than, Exact, Continue Token Exact — or raises the ``StatusError`` kube-apiserver
answers for the Invalid cells (``ValidateListOptions``: 422 Invalid; continue with a
resourceVersion: 400 BadRequest). Pure functions: the table tests call them directly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from watchcache import apierrors
from watchcache.cache.continuetoken import ContinueCodec, InvalidContinueToken, UnverifiedContinueToken
from watchcache.quoting import go_quote

EXACT = "Exact"
NOT_OLDER_THAN = "NotOlderThan"


class Mode(enum.Enum):
    MOST_RECENT = "Most Recent"
    ANY = "Any"
    NOT_OLDER_THAN = "Not older than"
    EXACT = "Exact"
    CONTINUE = "Continue Token, Exact"


@dataclass(frozen=True)
class ListOptions:
    """Query parameters of get/list/watch, already type-checked (see ``server.options``)."""

    resource_version: str = ""
    resource_version_match: str = ""
    limit: int = 0
    continue_token: str = ""
    label_selector: str = ""
    field_selector: str = ""
    # KEP-5866's shardSelector, as sent ("" when absent or empty: no selector, as kube).
    shard_selector: str = ""
    watch: bool = False
    allow_watch_bookmarks: bool = False
    send_initial_events: bool | None = None
    timeout_seconds: int | None = None


@dataclass(frozen=True)
class ReadPlan:
    mode: Mode
    rv: int = 0  # the rv the mode refers to (0: none)
    start: str | None = None  # continue: start key relative to the scope
    group: int = 1  # continue: how many events shared rv when the first page was read


@dataclass(frozen=True)
class WatchPlan:
    # How the starting point is chosen (MOST_RECENT, ANY, NOT_OLDER_THAN or EXACT).
    mode: Mode
    rv: int
    # Send the state at the start as ADDED events first ("Get State and Start at ...").
    initial_events: bool
    # End the initial events with a BOOKMARK annotated k8s.io/initial-events-end.
    initial_events_end_bookmark: bool


def parse_resource_version(text: str) -> int:
    """kube's ``APIObjectVersioner.ParseResourceVersion`` (a decimal uint64).

    A bad value is a 400 BadRequest. (kube answers a GET or WATCH with it from its storage layer as a
    500 without a reason; only a LIST gets the 400. A 500 for bad input is not copied: it would make
    a client's mistake look like a server fault, and no client library sends one.)
    """
    if text.isascii() and text.isdigit():  # leading zeros and all: Go's ParseUint(s, 10, 64)
        digits = text.lstrip("0")
        if len(digits) <= 20 and (number := int(digits or "0")) < 1 << 64:
            return number
        why = "value out of range"
    else:
        why = "invalid syntax"
    raise apierrors.bad_request(f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": {why}')


def _forbidden(field: str, detail: str) -> tuple[str, str, str]:
    return (field, "FieldValueForbidden", f"Forbidden: {detail}")


def _not_supported(field: str, value: str, supported: list[str]) -> tuple[str, str, str]:
    values = ", ".join(go_quote(v) for v in supported)
    return (field, "FieldValueNotSupported", f"Unsupported value: {go_quote(value)}: supported values: {values}")


def validate_list_options(opts: ListOptions) -> None:
    """``ValidateListOptions`` of k8s.io/apiserver: the Invalid cells of the tables (422)."""
    errors: list[tuple[str, str, str]] = []
    match = opts.resource_version_match
    rvm = "resourceVersionMatch"
    if opts.watch:
        initial_events = opts.send_initial_events
        if initial_events is None and not match and opts.resource_version in ("", "0"):
            # kube defaults these first (SetListOptionsDefaults, ``plan_watch``), so a legacy watch
            # with a continue token is refused for the match it did not send.
            initial_events, match = True, NOT_OLDER_THAN
        if initial_events is not None and match != NOT_OLDER_THAN:
            errors.append(
                _forbidden(rvm, f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}")
            )
        if match:
            if initial_events is None:
                errors.append(
                    _forbidden(rvm, "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")
                )
            if match != NOT_OLDER_THAN:
                errors.append(_not_supported(rvm, match, [NOT_OLDER_THAN]))
            if opts.continue_token:
                errors.append(_forbidden(rvm, "resourceVersionMatch is forbidden when continue is provided"))
    else:
        if match:
            if not opts.resource_version:
                errors.append(_forbidden(rvm, "resourceVersionMatch is forbidden unless resourceVersion is provided"))
            if opts.continue_token:
                errors.append(_forbidden(rvm, "resourceVersionMatch is forbidden when continue is provided"))
            if match not in (EXACT, NOT_OLDER_THAN):
                errors.append(_not_supported(rvm, match, [EXACT, NOT_OLDER_THAN, ""]))
            if match == EXACT and opts.resource_version == "0":
                errors.append(_forbidden(rvm, 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'))
        if opts.send_initial_events is not None:
            errors.append(_forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if errors:
        raise apierrors.invalid_list_options(errors)


def plan_get(resource_version: str, *, from_storage: bool = False) -> ReadPlan:
    """get: unset → Most Recent, "0" → Any, other → Not older than.

    ``from_storage``: kube serves this resource's GETs from etcd (``ResourceType.uncached_by_kube``),
    whose store refuses an unparsable rv in a LIST's words."""
    if not resource_version:
        return ReadPlan(Mode.MOST_RECENT)
    if resource_version == "0":
        return ReadPlan(Mode.ANY)
    try:
        return ReadPlan(Mode.NOT_OLDER_THAN, parse_resource_version(resource_version))
    except apierrors.StatusError as e:
        if not from_storage:
            raise
        raise apierrors.bad_request(f"invalid resource version: {e.message}") from None


def plan_list(opts: ListOptions, codec: ContinueCodec) -> ReadPlan:
    """list: the resourceVersionMatch × paging × resourceVersion table."""
    validate_list_options(opts)
    rv_text = opts.resource_version
    if opts.continue_token:
        # The token first, as kube: a bad one is "invalid continue token" whatever else is given.
        try:
            rv, start, group = codec.decode_with_group(opts.continue_token)
        except UnverifiedContinueToken:
            raise  # the caller decides: the upstream's own token, or a forgery (400)
        except InvalidContinueToken as e:
            raise apierrors.bad_request(f"invalid continue token: {e}") from None
        # "Invalid, treated as Continue Token, Exact" for "0"; HTTP 400 for any other value.
        if rv_text and rv_text != "0":
            raise apierrors.bad_request("specifying resource version is not allowed when using continue")
        return ReadPlan(Mode.CONTINUE, rv, start, group)
    if not rv_text:
        return ReadPlan(Mode.MOST_RECENT)
    if rv_text == "0":
        return ReadPlan(Mode.ANY)
    try:
        rv = parse_resource_version(rv_text)
    except apierrors.StatusError as e:  # a LIST words it so (a GET or WATCH does not)
        raise apierrors.bad_request(f"invalid resource version: {e.message}") from None
    match = opts.resource_version_match
    if match == EXACT:
        return ReadPlan(Mode.EXACT, rv)
    if match == NOT_OLDER_THAN:
        return ReadPlan(Mode.NOT_OLDER_THAN, rv)
    # Legacy (no resourceVersionMatch): a paged list is Exact, a full one Not older than.
    return ReadPlan(Mode.EXACT if opts.limit > 0 else Mode.NOT_OLDER_THAN, rv)


def plan_watch(opts: ListOptions) -> WatchPlan:
    """watch: Get State and Start at Most Recent / Any, Start at Exact, and streaming lists."""
    validate_list_options(opts)
    rv_text = opts.resource_version
    if rv_text == "":
        mode, rv = Mode.MOST_RECENT, 0
    elif rv_text == "0":
        mode, rv = Mode.ANY, 0
    else:
        rv = parse_resource_version(rv_text)
        mode = Mode.NOT_OLDER_THAN if opts.send_initial_events else Mode.EXACT
    if opts.send_initial_events is None:
        # kube >= 1.34 defaults a watch from "" or "0" to sendInitialEvents=true (with NotOlderThan:
        # SetListOptionsDefaults), so its initial events end with the initial-events-end bookmark
        # when bookmarks are allowed; from any other rv there are no initial events.
        initial = mode in (Mode.MOST_RECENT, Mode.ANY)
        return WatchPlan(mode, rv, initial, initial and opts.allow_watch_bookmarks)
    initial = opts.send_initial_events
    return WatchPlan(mode, rv, initial, initial and opts.allow_watch_bookmarks)

"""Query parameters to ``ListOptions``: types checked, with kube's error wording."""

from __future__ import annotations

import re
from collections.abc import Mapping

from watchcache import apierrors
from watchcache.cache.semantics import ListOptions

_INT64_MAX = (1 << 63) - 1
_GO_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _first(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def parse_bool(value: str | None) -> bool:
    """kube's ``Convert_Slice_string_To_bool``: absent, "0" and "false" (any case) are false; anything
    else is true, the empty value of ``?watch`` or ``?watch=`` included."""
    if value is None or value == "0":
        return False
    return value.lower() != "false"


def _int(query: Mapping[str, list[str]], name: str) -> int | None:
    value = _first(query, name)
    if value is None or value == "":
        return None
    # Go's ParseInt(s, 10, 64): an optional sign and ASCII digits, nothing else (Python's int()
    # would take spaces and underscores).
    if _GO_INT.fullmatch(value) is None:
        raise apierrors.bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax')
    digits = value.lstrip("+-").lstrip("0")
    if len(digits) > 19 or not -_INT64_MAX - 1 <= (number := int(value, 10)) <= _INT64_MAX:
        raise apierrors.bad_request(f'strconv.ParseInt: parsing "{value}": value out of range')
    return number


def parse_get_options(query: Mapping[str, list[str]]) -> ListOptions:
    """A GET's ``GetOptions``: its resourceVersion only. kube decodes nothing else for a GET, so a
    ``limit`` or ``resourceVersionMatch`` beside it is ignored, never a 400. But first it refuses
    ``export`` (GetResource): any first value but "0" or "false" (any case) is true, even empty."""
    export = query.get("export")
    if export and export[0] != "0" and export[0].lower() != "false":
        raise apierrors.bad_request("the export parameter, deprecated since v1.14, is no longer supported")
    return ListOptions(resource_version=_first(query, "resourceVersion") or "")


def parse_list_options(query: Mapping[str, list[str]], *, watch_path: bool = False, max_limit: int = 0) -> ListOptions:
    """The ``ListOptions`` of a get/list/watch request.

    A negative ``limit`` means no limit (as kube); ``max_limit`` (if set) clamps the page size
    so one request cannot pin the loop for an unbounded time.
    """
    # timeoutSeconds before limit: kube converts ListOptions' fields in their order, so a request
    # with both bad hears about timeoutSeconds. A negative one is not refused (kube validates none):
    # a LIST ignores it, a WATCH ends at once (``server/watch.py``).
    timeout = _int(query, "timeoutSeconds")
    limit = _int(query, "limit") or 0
    if limit < 0:
        limit = 0
    if max_limit and limit > max_limit:
        limit = max_limit
    send_initial = _first(query, "sendInitialEvents")
    return ListOptions(
        resource_version=_first(query, "resourceVersion") or "",
        resource_version_match=_first(query, "resourceVersionMatch") or "",
        limit=limit,
        continue_token=_first(query, "continue") or "",
        label_selector=_first(query, "labelSelector") or "",
        field_selector=_first(query, "fieldSelector") or "",
        shard_selector=_first(query, "shardSelector") or "",
        watch=watch_path or parse_bool(_first(query, "watch")),
        allow_watch_bookmarks=parse_bool(_first(query, "allowWatchBookmarks")),
        send_initial_events=None if send_initial is None else parse_bool(send_initial),
        timeout_seconds=timeout,
    )

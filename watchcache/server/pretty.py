"""Pretty-printed JSON answers, for people: kube-apiserver indents a GET's, LIST's or error's JSON for
``?pretty=true`` and for curl, Wget and browsers (``negotiation.isPrettyPrint``), and for an Accept
type with ``pretty=1``. Watch streams and protobuf are never indented.

kube writes them with Go's ``json.MarshalIndent(obj, "", "  ")``: two spaces, ``": "``, ``{}`` and
``[]`` when empty, HTML characters and U+2028/U+2029 escaped, and no newline at the end (its compact
answers end with one). orjson's ``OPT_INDENT_2`` writes the same layout; the escapes are added after,
which is safe because those characters can only occur inside JSON strings.

An answer is indented from its cached compact bytes: parsed, then written again, with the loop
blocked meanwhile (a LIST of 1,560 ConfigMaps, 1 MiB: 12.5 ms median, 20 ms at worst of 20, on this
project's 2-core machines, session 46). So an answer longer than ``PRETTY_MAX`` bytes is written
compact, as it is cached, rather than stall every other client of the worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from watchcache.quoting import go_json_escape

# Above this, the answer goes out compact (see the module's docstring).
PRETTY_MAX = 1 << 20

_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))  # Go's strconv.ParseBool
_PEOPLE = ("curl", "Wget", "Mozilla/5.0")


def wants_pretty(query: Mapping[str, list[str]], headers: Mapping[str, str]) -> bool:
    """kube's ``isPrettyPrint``: a non-empty ``pretty`` parameter decides (Go's ParseBool; anything
    it cannot parse is false); otherwise the User-Agent of a person's tool does."""
    values = query.get("pretty")
    if values and values[0]:
        return values[0] in _TRUE
    return headers.get("user-agent", "").startswith(_PEOPLE)


def accepts_pretty(accept: str | None) -> bool:
    """Whether an Accept header may carry kube's ``pretty=1`` media type parameter (checked exactly by
    the negotiation, ``negotiation.pretty_accepted``); a cheap test first, as most carry none."""
    return accept is not None and "pretty" in accept


def indent(parts: Sequence[bytes]) -> bytes | None:
    """The compact JSON answer ``parts`` indented as kube indents it, or None when it is longer than
    ``PRETTY_MAX`` (then it goes out compact)."""
    if sum(len(p) for p in parts) > PRETTY_MAX:
        return None
    return go_json_escape(orjson.dumps(orjson.loads(b"".join(parts)), option=orjson.OPT_INDENT_2))

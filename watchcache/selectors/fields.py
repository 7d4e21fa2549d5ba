"""Kubernetes field selectors, parsed and matched the way kube-apiserver does.

Follows ``k8s.io/apimachinery/pkg/fields`` (``ParseSelector``, ``UnescapeValue``) plus the
apiserver's per-resource check that each field is one it can select on, whose
``field label not supported: <field>`` is what clients see for a typo.

There is no whitespace trimming: ``metadata.name = x`` is the field ``"metadata.name "``
(unsupported) with the value ``" x"``, exactly as upstream.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from watchcache.selectors.errors import SelectorError, UnsupportedFieldError
from watchcache.selectors.labels import Operator

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "SelectorError",
    "escape_field_value",
    "parse_field_selector",
    "unescape_field_value",
]


def escape_field_value(value: str) -> str:
    """Escape a literal for use as a field selector value (apimachinery ``EscapeValue``)."""
    if "\\" not in value and "," not in value and "=" not in value:
        return value
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def unescape_field_value(text: str) -> str:
    """Undo :func:`escape_field_value`; rejects what apimachinery's ``UnescapeValue`` rejects.

    Only ``\\\\``, ``\\,`` and ``\\=`` are escapes; an unescaped ``,`` or ``=`` is an error.
    The rune in that error is printed as its code point, as Go's ``%v`` of a rune does.
    """
    if "\\" not in text and "," not in text and "=" not in text:
        return text
    out: list[str] = []
    in_slash = False
    for ch in text:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == "," or ch == "=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``field=value`` or ``field!=value``; ``==`` is stored as ``=`` (as apimachinery does)."""

    field: str
    operator: Operator
    value: str

    def __post_init__(self) -> None:
        op = Operator(self.operator)
        if op is Operator.DOUBLE_EQUALS:
            op = Operator.EQUALS
        if op not in (Operator.EQUALS, Operator.NOT_EQUALS):
            raise SelectorError(f"field selectors support only '=', '==' and '!=', not {op.value!r}")
        object.__setattr__(self, "operator", op)

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Unoptimised single-term check; :meth:`FieldSelector.matches` is the fast path."""
        have = fields.get(self.field, "")
        return have == self.value if self.operator is Operator.EQUALS else have != self.value

    def __str__(self) -> str:
        return f"{self.field}{self.operator.value}{escape_field_value(self.value)}"


def _sort_key(r: FieldRequirement) -> tuple[str, str, str]:
    return (r.field, r.operator.value, r.value)


class FieldSelector:
    """An AND of :class:`FieldRequirement`, compiled for cheap :meth:`matches`.

    Requirements are sorted by field, operator and value so ``str()`` is canonical and
    equal selectors compare and hash equal.
    """

    __slots__ = ("_eq", "_exact", "_hash", "_ne", "_trivial", "requirements")

    requirements: tuple[FieldRequirement, ...]

    def __init__(self, requirements: Iterable[FieldRequirement] = ()) -> None:
        reqs = tuple(sorted(requirements, key=_sort_key))
        eq = tuple((r.field, r.value) for r in reqs if r.operator is Operator.EQUALS)
        self.requirements = reqs
        self._eq = eq
        self._ne = tuple((r.field, r.value) for r in reqs if r.operator is Operator.NOT_EQUALS)
        exact: dict[str, str] = {}
        for field, value in eq:
            exact.setdefault(field, value)
        self._exact = exact
        self._trivial = not reqs
        self._hash = hash(reqs)

    @property
    def empty(self) -> bool:
        """True for the selector that matches everything (apimachinery's ``Empty()``)."""
        return self._trivial

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object with these field values is selected; a missing field is ``""``."""
        if self._trivial:
            return True
        get = fields.get
        for field, value in self._eq:
            if get(field, "") != value:
                return False
        for field, value in self._ne:  # noqa: SIM110 - a plain loop beats all(<genexpr>) here
            if get(field, "") == value:
                return False
        return True

    def exact_value(self, field: str) -> str | None:
        """The value ``field`` must equal for a match, if pinned with ``=``/``==``.

        Lets callers index watchers by e.g. ``metadata.name`` and turn a LIST with
        ``metadata.name=x`` into a key lookup.
        """
        return self._exact.get(field)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return f"FieldSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldSelector):
            return NotImplemented
        return self.requirements == other.requirements

    def __hash__(self) -> int:
        return self._hash


EVERYTHING: Final = FieldSelector()


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not backslash-escaped; escapes stay in the terms."""
    if "\\" not in text:
        return text.split(",")
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, ch in enumerate(text):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, Operator, str] | None:
    """Split at the first operator; the field part has no escaping, as upstream."""
    eq = term.find("=")  # every operator contains "=", so the first "=" decides
    if eq < 0:
        return None
    if eq > 0 and term[eq - 1] == "!":
        return term[: eq - 1], Operator.NOT_EQUALS, term[eq + 1 :]
    if term.startswith("==", eq):
        return term[:eq], Operator.DOUBLE_EQUALS, term[eq + 2 :]
    return term[:eq], Operator.EQUALS, term[eq + 1 :]


def parse_field_selector(text: str, supported: Collection[str]) -> FieldSelector:
    """Parse ``fieldSelector`` text as kube-apiserver does for a resource.

    ``supported`` is the resource's selectable fields. Syntax errors are reported before
    unsupported fields, and terms are examined in sorted order, both as upstream, so the
    client gets the same message kube-apiserver would have given.
    """
    if not text:
        return EVERYTHING
    parts = _split_terms(text)
    parts.sort()
    parsed: list[tuple[str, Operator, str]] = []
    for part in parts:
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, raw = split
        parsed.append((field, op, unescape_field_value(raw)))
    reqs: list[FieldRequirement] = []
    for field, op, value in parsed:
        if not field and not value:
            continue  # the parse drops a term empty on both sides (Transform), before any field is checked
        if field not in supported:
            raise UnsupportedFieldError(field)
        reqs.append(FieldRequirement(field, op, value))
    return FieldSelector(reqs) if reqs else EVERYTHING

"""Kubernetes label selectors, parsed and matched the way k8s.io/apimachinery does.

Clients send ``labelSelector=`` text meant for kube-apiserver; any difference in what we
accept, reject or match would make a LIST or WATCH through the cache disagree with one
straight to the apiserver. So the lexer and parser follow ``pkg/labels/selector.go``
token for token (including its quirks: ``x in ()`` means ``x in ("")``, ``in``/``notin``
are ordinary words where a value is expected, a NUL byte ends a token or the input), and error text
follows apimachinery's because it is returned to the client in a 400 ``Status``.

Parsing happens once per request; :meth:`LabelSelector.matches` runs once per object per
request or watch event, so the selector is compiled into flat tuples of checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from string import ascii_letters, ascii_lowercase, digits
from typing import Any, Final

from watchcache.quoting import go_quote
from watchcache.selectors.errors import SelectorError

__all__ = [
    "LabelRequirement",
    "LabelSelector",
    "Operator",
    "SelectorError",
    "parse_label_selector",
]


class Operator(StrEnum):
    """Values are apimachinery's ``selection.Operator`` strings, so logs read the same."""

    IN = "in"
    NOT_IN = "notin"
    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


# Order of apimachinery's validRequirementOperators; it appears in error messages.
_BINARY_OPERATORS: Final = (
    Operator.IN,
    Operator.NOT_IN,
    Operator.EQUALS,
    Operator.DOUBLE_EQUALS,
    Operator.NOT_EQUALS,
    Operator.GREATER_THAN,
    Operator.LESS_THAN,
)
_VALID_OPERATORS: Final = (*_BINARY_OPERATORS, Operator.EXISTS, Operator.DOES_NOT_EXIST)
# Rank used only to give requirements on the same key a deterministic order.
_OP_RANK: Final = {op: i for i, op in enumerate(_VALID_OPERATORS)}

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


# --------------------------------------------------------------------------------------
# Validation (k8s.io/apimachinery/pkg/api/validate/content: IsLabelKey, IsLabelValue).
# Hand-written rather than regex: the input is client-controlled and unbounded, and a
# backtracking regex over it would be quadratic where Go's RE2 is linear.

_ALNUM: Final = frozenset(ascii_letters + digits)
_NAME_CHARS: Final = _ALNUM | frozenset("-_.")
_DNS_ALNUM: Final = frozenset(ascii_lowercase + digits)
_DNS_CHARS: Final = _DNS_ALNUM | frozenset("-")

_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME_ERR: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_DNS_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_FMT: Final = _DNS_LABEL_FMT + "(\\." + _DNS_LABEL_FMT + ")*"
_DNS_SUBDOMAIN_ERR: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)
_VALUE_FMT: Final = "(" + _NAME_FMT + ")?"
_VALUE_ERR: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, "
    "'-', '_' or '.', and must start and end with an alphanumeric character"
)
_NAME_MAX: Final = 63
_VALUE_MAX: Final = 63
_DNS_SUBDOMAIN_MAX: Final = 253


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Reproduces apimachinery's RegexError, double space after each comma included.
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len_error(n: int) -> str:
    # apimachinery's label validation counts bytes, and says so (an object's name still says "characters").
    return f"must be no more than {n} bytes"


def _blen(s: str) -> int:
    """Length in bytes, as Go's ``len`` counts it."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _is_name(s: str) -> bool:
    return bool(s) and s[0] in _ALNUM and s[-1] in _ALNUM and _NAME_CHARS.issuperset(s)


def _is_dns_subdomain(s: str) -> bool:
    for label in s.split("."):
        if not label or label[0] not in _DNS_ALNUM or label[-1] not in _DNS_ALNUM:
            return False
        if not _DNS_CHARS.issuperset(label):
            return False
    return True


def _label_key_errors(key: str) -> list[str]:
    errs: list[str] = []
    prefix, slash, name = key.partition("/")
    if not slash:
        name = key
    elif "/" in name:
        return [
            "a valid label key "
            + _regex_error(_NAME_ERR, _NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    elif not prefix:
        errs.append("prefix part must be non-empty")
    else:
        if _blen(prefix) > _DNS_SUBDOMAIN_MAX:
            errs.append("prefix part " + _max_len_error(_DNS_SUBDOMAIN_MAX))
        if not _is_dns_subdomain(prefix):
            errs.append("prefix part " + _regex_error(_DNS_SUBDOMAIN_ERR, _DNS_SUBDOMAIN_FMT, "example.com"))
    if not name:
        errs.append("name part must be non-empty")
    elif _blen(name) > _NAME_MAX:
        errs.append("name part " + _max_len_error(_NAME_MAX))
    if not _is_name(name):
        errs.append("name part " + _regex_error(_NAME_ERR, _NAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _label_value_errors(value: str) -> list[str]:
    errs: list[str] = []
    if _blen(value) > _VALUE_MAX:
        errs.append(_max_len_error(_VALUE_MAX))
    if value and not _is_name(value):
        errs.append(_regex_error(_VALUE_ERR, _VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _invalid(path: str, bad_value: str, errs: list[str]) -> str:
    """apimachinery's ``field.Invalid(path, value, detail).Error()``."""
    return f"{path}: Invalid value: {go_quote(bad_value)}: {'; '.join(errs)}"


def _invalid_list(path: str, values: tuple[str, ...], detail: str) -> str:
    # A []string bad value is rendered as JSON.
    return f"{path}: Invalid value: {json.dumps(list(values), separators=(',', ':'), ensure_ascii=False)}: {detail}"


def _aggregate(msgs: list[str]) -> str:
    """apimachinery's ``utilerrors.Aggregate.Error()``: deduplicated, bracketed if several."""
    unique = list(dict.fromkeys(msgs))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def _parse_int64(s: str) -> int | None:
    """``strconv.ParseInt(s, 10, 64)``: stricter than ``int()`` (no ``_``, no spaces)."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or not body.isascii() or not body.isdigit():
        return None
    n = int(s)
    return n if _INT64_MIN <= n <= _INT64_MAX else None


# --------------------------------------------------------------------------------------
# The model.


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One ANDed term, validated as apimachinery's ``NewRequirement`` validates it.

    ``values`` is stored sorted and deduplicated (it is a set in apimachinery's parser), so
    equal requirements compare and hash equal whatever order they were written in.
    """

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        given = tuple(self.values)
        errs: list[str] = []
        if key_errs := _label_key_errors(self.key):
            errs.append(_invalid("key", self.key, key_errs))
        try:
            op = Operator(self.operator)
        except ValueError:
            supported = ", ".join(f'"{o.value}"' for o in _VALID_OPERATORS)
            errs.append(f"operator: Unsupported value: {go_quote(str(self.operator))}: supported values: {supported}")
            raise SelectorError(_aggregate(errs)) from None
        if op in (Operator.IN, Operator.NOT_IN):
            if not given:
                errs.append(_invalid_list("values", given, "for 'in', 'notin' operators, values set can't be empty"))
        elif op in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS):
            if len(given) != 1:
                errs.append(_invalid_list("values", given, "exact-match compatibility requires one single value"))
        elif op in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
            if given:
                errs.append(_invalid_list("values", given, "values set must be empty for exists and does not exist"))
        else:
            if len(given) != 1:
                errs.append(_invalid_list("values", given, "for 'Gt', 'Lt' operators, exactly one value is required"))
            for i, v in enumerate(given):
                if _parse_int64(v) is None:
                    errs.append(_invalid(f"values[{i}]", v, ["for 'Gt', 'Lt' operators, the value must be an integer"]))
        for i, v in enumerate(given):
            if value_errs := _label_value_errors(v):
                errs.append(_invalid(f"values[{i}][{self.key}]", v, value_errs))
        if errs:
            raise SelectorError(_aggregate(errs))
        object.__setattr__(self, "operator", op)
        object.__setattr__(self, "values", tuple(sorted(set(given))))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Unoptimised single-term check; :meth:`LabelSelector.matches` is the fast path."""
        op = self.operator
        if op is Operator.EXISTS:
            return self.key in labels
        if op is Operator.DOES_NOT_EXIST:
            return self.key not in labels
        value = labels.get(self.key)
        if op in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS):
            return value is not None and value in self.values
        if op in (Operator.NOT_IN, Operator.NOT_EQUALS):
            return value is None or value not in self.values
        if value is None or (have := _parse_int64(value)) is None:
            return False
        bound = _parse_int64(self.values[0])
        assert bound is not None  # validated in __post_init__
        return have > bound if op is Operator.GREATER_THAN else have < bound

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return "!" + self.key
        joined = ",".join(self.values)
        if op is Operator.IN:
            return f"{self.key} in ({joined})"
        if op is Operator.NOT_IN:
            return f"{self.key} notin ({joined})"
        symbol = {Operator.GREATER_THAN: ">", Operator.LESS_THAN: "<"}.get(op, op.value)
        return f"{self.key}{symbol}{joined}"


def _sort_key(r: LabelRequirement) -> tuple[str, int, tuple[str, ...]]:
    return (r.key, _OP_RANK[r.operator], r.values)


# Kinds of the non-equality checks a LabelSelector compiles to (see LabelSelector.matches).
_K_IN, _K_NOT_IN, _K_EXISTS, _K_ABSENT, _K_GT, _K_LT = range(6)


class LabelSelector:
    """An AND of :class:`LabelRequirement`, compiled for cheap :meth:`matches`.

    Requirements are kept sorted by key (as apimachinery sorts them), then operator and
    values, so ``str()`` is canonical and equal selectors compare and hash equal.
    """

    __slots__ = ("_checks", "_eq", "_exact", "_hash", "requirements")

    requirements: tuple[LabelRequirement, ...]

    def __init__(self, requirements: Iterable[LabelRequirement] = ()) -> None:
        reqs = tuple(sorted(requirements, key=_sort_key))
        # Equality (the common case) gets its own loop; everything else is one tuple of
        # (kind, key, argument) so an all-equality selector pays for a single extra check.
        eq: list[tuple[str, str]] = []
        checks: list[tuple[int, str, Any]] = []
        exact: dict[str, str] = {}
        for r in reqs:
            op, key, values = r.operator, r.key, r.values
            if op in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN):
                if len(values) == 1:
                    eq.append((key, values[0]))
                    exact.setdefault(key, values[0])
                else:
                    checks.append((_K_IN, key, frozenset(values)))
            elif op in (Operator.NOT_EQUALS, Operator.NOT_IN):
                checks.append((_K_NOT_IN, key, frozenset(values)))
            elif op is Operator.EXISTS:
                checks.append((_K_EXISTS, key, None))
            elif op is Operator.DOES_NOT_EXIST:
                checks.append((_K_ABSENT, key, None))
            else:
                bound = _parse_int64(values[0])
                assert bound is not None  # validated by LabelRequirement
                checks.append((_K_GT if op is Operator.GREATER_THAN else _K_LT, key, bound))
        self.requirements = reqs
        self._eq = tuple(eq)
        self._checks = tuple(checks)
        self._exact = exact
        self._hash = hash(reqs)

    @property
    def empty(self) -> bool:
        """True for the selector that matches everything (apimachinery's ``Empty()``)."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels is selected (apimachinery's semantics)."""
        get = labels.get
        for key, value in self._eq:
            if get(key) != value:  # an absent key gives None, which never equals
                return False
        for kind, key, arg in self._checks:
            if kind == _K_IN:
                if get(key) not in arg:
                    return False
            elif kind == _K_NOT_IN:
                # != and notin select objects that lack the key, as in apimachinery.
                if get(key) in arg:
                    return False
            elif kind == _K_EXISTS:
                if key not in labels:
                    return False
            elif kind == _K_ABSENT:
                if key in labels:
                    return False
            else:
                raw = get(key)
                have = None if raw is None else _parse_int64(raw)
                if have is None or (have <= arg if kind == _K_GT else have >= arg):
                    return False
        return True

    def exact_value(self, key: str) -> str | None:
        """The value ``key`` must have for a match, if the selector pins it; for indexing.

        Pinned means ``key=v``, ``key==v`` or ``key in (v)``.
        """
        return self._exact.get(key)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSelector):
            return NotImplemented
        return self.requirements == other.requirements

    def __hash__(self) -> int:
        return self._hash


EVERYTHING: Final = LabelSelector()


# --------------------------------------------------------------------------------------
# Lexer and parser: a transliteration of apimachinery's, since its quirks are the spec.

_ERROR, _EOS, _CLOSE_PAR, _COMMA, _NOT, _DOUBLE_EQ, _EQ, _GT, _IDENT, _IN, _LT, _NOT_EQ, _NOT_IN, _OPEN_PAR = range(14)

_STRING_TO_TOKEN: Final = {
    ")": _CLOSE_PAR,
    ",": _COMMA,
    "!": _NOT,
    "==": _DOUBLE_EQ,
    "=": _EQ,
    ">": _GT,
    "in": _IN,
    "<": _LT,
    "!=": _NOT_EQ,
    "notin": _NOT_IN,
    "(": _OPEN_PAR,
}
_WHITESPACE: Final = frozenset(" \t\r\n")
_SPECIAL: Final = frozenset("=!(),><")
_END: Final = "\0"  # what Go's lexer reads past the end; a literal NUL also ends a token


def _lex(s: str) -> list[tuple[int, str]]:
    items: list[tuple[int, str]] = []
    n = len(s)
    pos = 0
    while True:
        # skip whitespace
        while True:
            if pos >= n:
                ch = _END
                break
            ch = s[pos]
            pos += 1
            if ch not in _WHITESPACE:
                break
        if ch == _END:
            items.append((_EOS, ""))
            return items
        start = pos - 1
        pos = start
        if ch in _SPECIAL:
            buf = ""
            last: tuple[int, str] | None = None
            while pos < n:
                ch = s[pos]
                pos += 1
                if ch == _END:
                    break
                if ch not in _SPECIAL:
                    pos -= 1
                    break
                buf += ch
                tok = _STRING_TO_TOKEN.get(buf)
                if tok is not None:
                    last = (tok, buf)
                elif last is not None:
                    pos -= 1
                    break
            items.append(last if last is not None else (_ERROR, f"error expected: keyword found '{buf}'"))
        else:
            while pos < n:
                ch = s[pos]
                if ch == _END:
                    word = s[start:pos]
                    pos += 1
                    break
                if ch in _SPECIAL or ch in _WHITESPACE:
                    word = s[start:pos]
                    break
                pos += 1
            else:
                word = s[start:pos]
            items.append((_IN if word == "in" else _NOT_IN if word == "notin" else _IDENT, word))


class _Fail(Exception):
    """A requirement-level parse error, wrapped by the caller like apimachinery does."""


_KEY_AND_OPERATOR, _VALUES = 0, 1

_OPERATOR_TOKENS: Final = {
    _IN: Operator.IN,
    _EQ: Operator.EQUALS,
    _DOUBLE_EQ: Operator.DOUBLE_EQUALS,
    _GT: Operator.GREATER_THAN,
    _LT: Operator.LESS_THAN,
    _NOT_IN: Operator.NOT_IN,
    _NOT_EQ: Operator.NOT_EQUALS,
}
_EXPECTED_OPERATORS: Final = ", ".join(op.value for op in _BINARY_OPERATORS)


class _Parser:
    __slots__ = ("items", "position")

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, context: int) -> tuple[int, str]:
        tok, lit = self.items[min(self.position, len(self.items) - 1)]
        if context == _VALUES and tok in (_IN, _NOT_IN):
            tok = _IDENT
        return tok, lit

    def consume(self, context: int) -> tuple[int, str]:
        item = self.lookahead(context)
        self.position += 1
        return item

    def parse(self) -> list[LabelRequirement]:
        reqs: list[LabelRequirement] = []
        while True:
            tok, lit = self.lookahead(_VALUES)
            if tok == _EOS:
                return reqs
            if tok not in (_IDENT, _NOT):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self.parse_requirement())
            except (_Fail, SelectorError) as e:
                raise SelectorError(f"unable to parse requirement: {e}") from None
            tok, lit = self.consume(_VALUES)
            if tok == _EOS:
                return reqs
            if tok != _COMMA:
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            tok, lit = self.lookahead(_VALUES)
            if tok not in (_IDENT, _NOT):
                raise SelectorError(f"found '{lit}', expected: identifier after ','")

    def parse_requirement(self) -> LabelRequirement:
        negated = False
        tok, key = self.consume(_VALUES)
        if tok == _NOT:
            negated = True
            tok, key = self.consume(_VALUES)
        if tok != _IDENT:
            raise _Fail(f"found '{key}', expected: identifier")
        if errs := _label_key_errors(key):
            # apimachinery validates the key here with a nil field path, hence "<nil>".
            raise _Fail(_invalid("<nil>", key, errs))
        if negated:
            return LabelRequirement(key, Operator.DOES_NOT_EXIST)
        if self.lookahead(_VALUES)[0] in (_EOS, _COMMA):
            return LabelRequirement(key, Operator.EXISTS)
        tok, lit = self.consume(_KEY_AND_OPERATOR)
        op = _OPERATOR_TOKENS.get(tok)
        if op is None:
            raise _Fail(f"found '{lit}', expected: {_EXPECTED_OPERATORS}")
        values = self.parse_values() if op in (Operator.IN, Operator.NOT_IN) else self.parse_exact_value()
        return LabelRequirement(key, op, tuple(sorted(values)))

    def parse_values(self) -> set[str]:
        tok, lit = self.consume(_VALUES)
        if tok != _OPEN_PAR:
            raise _Fail(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(_VALUES)
        if tok == _CLOSE_PAR:  # "()" means the single empty value
            self.consume(_VALUES)
            return {""}
        if tok not in (_IDENT, _COMMA):
            raise _Fail(f"found '{lit}', expected: ',', ')' or identifier")
        values = self.parse_identifiers_list()
        self.consume(_VALUES)  # the ')' parse_identifiers_list stopped at
        return values

    def parse_identifiers_list(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self.consume(_VALUES)
            if tok == _IDENT:
                values.add(lit)
                tok2, lit2 = self.lookahead(_VALUES)
                if tok2 == _COMMA:
                    continue
                if tok2 == _CLOSE_PAR:
                    return values
                raise _Fail(f"found '{lit2}', expected: ',' or ')'")
            if tok == _COMMA:
                # Empty values: "(,a)", "(a,)", "(a,,b)" all contribute "".
                if not values:
                    values.add("")
                tok2, _ = self.lookahead(_VALUES)
                if tok2 == _CLOSE_PAR:
                    values.add("")
                    return values
                if tok2 == _COMMA:
                    self.consume(_VALUES)
                    values.add("")
                continue
            raise _Fail(f"found '{lit}', expected: ',', or identifier")

    def parse_exact_value(self) -> set[str]:
        tok, _ = self.lookahead(_VALUES)
        if tok in (_EOS, _COMMA):
            return {""}
        tok, lit = self.consume(_VALUES)
        if tok == _IDENT:
            return {lit}
        raise _Fail(f"found '{lit}', expected: identifier")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse ``labelSelector`` text exactly as kube-apiserver (``labels.Parse``) would.

    Raises :class:`SelectorError` with apimachinery's message for anything it rejects.
    """
    if not text:
        return EVERYTHING
    reqs = _Parser(text).parse()
    return LabelSelector(reqs) if reqs else EVERYTHING

"""Label selectors must accept, reject and match exactly what kube-apiserver does."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchcache.selectors import (
    LabelRequirement,
    LabelSelector,
    Operator,
    SelectorError,
    parse_label_selector,
)

# apimachinery's validation messages, spelled out once.
NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation "
    "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
DNS_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
INT_RULE = "for 'Gt', 'Lt' operators, the value must be an integer"
OPERATORS = "in, notin, =, ==, !=, gt, lt"
REQ = "unable to parse requirement: "


def key_error(key: str, detail: str) -> str:
    return f'{REQ}<nil>: Invalid value: "{key}": {detail}'


def value_error(key: str, value: str, index: int = 0) -> str:
    return f'values[{index}][{key}]: Invalid value: "{value}": {VALUE_RULE}'


# --------------------------------------------------------------------------------------
# Parsing: accepted text, its requirements and canonical string.

PARSE_CASES = [
    # (id, text, [(key, operator, values)], canonical str)
    ("empty", "", [], ""),
    ("only-whitespace", " \t\r\n ", [], ""),
    ("exists", "a", [("a", Operator.EXISTS, ())], "a"),
    ("does-not-exist", "!a", [("a", Operator.DOES_NOT_EXIST, ())], "!a"),
    ("not-with-space", "! a", [("a", Operator.DOES_NOT_EXIST, ())], "!a"),
    ("equals", "a=b", [("a", Operator.EQUALS, ("b",))], "a=b"),
    ("double-equals", "a==b", [("a", Operator.DOUBLE_EQUALS, ("b",))], "a==b"),
    ("not-equals", "a!=b", [("a", Operator.NOT_EQUALS, ("b",))], "a!=b"),
    ("in", "a in (y,x)", [("a", Operator.IN, ("x", "y"))], "a in (x,y)"),
    ("in-dedup", "a in (x,y,x)", [("a", Operator.IN, ("x", "y"))], "a in (x,y)"),
    ("in-no-space-before-paren", "a in(x)", [("a", Operator.IN, ("x",))], "a in (x)"),
    ("notin", "a notin (x, y)", [("a", Operator.NOT_IN, ("x", "y"))], "a notin (x,y)"),
    ("greater-than", "a>5", [("a", Operator.GREATER_THAN, ("5",))], "a>5"),
    ("less-than", "a<10", [("a", Operator.LESS_THAN, ("10",))], "a<10"),
    ("gt-leading-zero", "a>007", [("a", Operator.GREATER_THAN, ("007",))], "a>007"),
    ("empty-value-equals", "a=", [("a", Operator.EQUALS, ("",))], "a="),
    ("empty-value-double-equals", "a==", [("a", Operator.DOUBLE_EQUALS, ("",))], "a=="),
    ("empty-value-not-equals", "a!=,b", [("a", Operator.NOT_EQUALS, ("",)), ("b", Operator.EXISTS, ())], "a!=,b"),
    ("empty-parens", "a in ()", [("a", Operator.IN, ("",))], "a in ()"),
    ("empty-via-comma", "a in (,)", [("a", Operator.IN, ("",))], "a in ()"),
    ("trailing-comma-in-set", "a in (x,)", [("a", Operator.IN, ("", "x"))], "a in (,x)"),
    ("leading-comma-in-set", "a notin (,x)", [("a", Operator.NOT_IN, ("", "x"))], "a notin (,x)"),
    ("double-comma-in-set", "a in (x,,y)", [("a", Operator.IN, ("", "x", "y"))], "a in (,x,y)"),
    ("and-sorted-by-key", "b=1,a", [("a", Operator.EXISTS, ()), ("b", Operator.EQUALS, ("1",))], "a,b=1"),
    (
        "whitespace-everywhere",
        "\t a \n= b ,\r c  notin ( d ,e ) ",
        [("a", Operator.EQUALS, ("b",)), ("c", Operator.NOT_IN, ("d", "e"))],
        "a=b,c notin (d,e)",
    ),
    (
        "prefixed-key",
        "app.kubernetes.io/name=web",
        [("app.kubernetes.io/name", Operator.EQUALS, ("web",))],
        "app.kubernetes.io/name=web",
    ),
    ("keyword-as-key", "in in (in,notin)", [("in", Operator.IN, ("in", "notin"))], "in in (in,notin)"),
    ("keyword-as-exists", "notin", [("notin", Operator.EXISTS, ())], "notin"),
    ("keyword-as-value", "a=notin", [("a", Operator.EQUALS, ("notin",))], "a=notin"),
    ("value-63-chars", "a=" + "v" * 63, [("a", Operator.EQUALS, ("v" * 63,))], "a=" + "v" * 63),
    (
        "key-253-prefix",
        "a" * 253 + "/" + "n" * 63,
        [("a" * 253 + "/" + "n" * 63, Operator.EXISTS, ())],
        "a" * 253 + "/" + "n" * 63,
    ),
    ("same-key-twice", "a!=x,a", [("a", Operator.NOT_EQUALS, ("x",)), ("a", Operator.EXISTS, ())], "a!=x,a"),
    ("nul-ends-input", "a=b \0 ,garbage(", [("a", Operator.EQUALS, ("b",))], "a=b"),
    ("nul-ends-identifier", "a\0", [("a", Operator.EXISTS, ())], "a"),
    # Go's lexer swallows a NUL that ends a run of operator characters.
    ("nul-after-operator-swallowed", "a,\0b", [("a", Operator.EXISTS, ()), ("b", Operator.EXISTS, ())], "a,b"),
]


@pytest.mark.parametrize(
    ("text", "expected", "canonical"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES]
)
def test_parse(text: str, expected: list[tuple[str, Operator, tuple[str, ...]]], canonical: str) -> None:
    sel = parse_label_selector(text)
    assert [(r.key, r.operator, r.values) for r in sel.requirements] == expected
    assert str(sel) == canonical
    assert sel.empty == (not expected)
    assert parse_label_selector(str(sel)) == sel


# --------------------------------------------------------------------------------------
# Errors: every class, with apimachinery's message.

ERROR_CASES = [
    ("bad-key-char", "a@b", key_error("a@b", "name part " + NAME_RULE)),
    ("bad-key-start", "-a", key_error("-a", "name part " + NAME_RULE)),
    ("key-too-long", "k" * 64, key_error("k" * 64, "name part must be no more than 63 bytes")),
    (
        "key-too-long-and-bad",
        "k" * 63 + "-",
        key_error("k" * 63 + "-", "name part must be no more than 63 bytes; name part " + NAME_RULE),
    ),
    ("key-empty-prefix", "/a", key_error("/a", "prefix part must be non-empty")),
    ("key-empty-name", "a/", key_error("a/", "name part must be non-empty; name part " + NAME_RULE)),
    ("key-bad-prefix", "Example.com/a", key_error("Example.com/a", "prefix part " + DNS_RULE)),
    (
        "key-prefix-too-long",
        "a" * 254 + "/b",
        key_error("a" * 254 + "/b", "prefix part must be no more than 253 bytes"),
    ),
    (
        "key-two-slashes",
        "a/b/c",
        key_error(
            "a/b/c",
            "a valid label key " + NAME_RULE + " with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')",
        ),
    ),
    ("key-quoted-like-go", 'a"b', key_error('a\\"b', "name part " + NAME_RULE)),
    ("key-non-ascii", "ключ", key_error("ключ", "name part " + NAME_RULE)),
    ("key-control-char", "a\x01", key_error("a\\x01", "name part " + NAME_RULE)),
    ("bad-value", "a=b@", REQ + value_error("a", "b@")),
    ("bad-value-in-set-index", "a in (x,y@)", REQ + value_error("a", "y@", 1)),
    ("two-bad-values", "a in (x@,y@)", REQ + "[" + value_error("a", "x@") + ", " + value_error("a", "y@", 1) + "]"),
    (
        "value-too-long",
        "a=" + "v" * 64,
        REQ + f'values[0][a]: Invalid value: "{"v" * 64}": must be no more than 63 bytes',
    ),
    ("gt-not-integer", "a>x", REQ + 'values[0]: Invalid value: "x": ' + INT_RULE),
    ("gt-empty", "a>", REQ + 'values[0]: Invalid value: "": ' + INT_RULE),
    ("lt-overflow", "a<9223372036854775808", REQ + 'values[0]: Invalid value: "9223372036854775808": ' + INT_RULE),
    ("gt-negative-is-bad-label-value", "a>-1", REQ + value_error("a", "-1")),
    (
        "gt-not-integer-and-bad-value",
        "a>x@",
        REQ + '[values[0]: Invalid value: "x@": ' + INT_RULE + ", " + value_error("a", "x@") + "]",
    ),
    ("unknown-operator", "a~b", key_error("a~b", "name part " + NAME_RULE)),
    ("missing-operator", "a b", REQ + f"found 'b', expected: {OPERATORS}"),
    ("bang-not-operator", "a!b", REQ + f"found '!', expected: {OPERATORS}"),
    ("ge-is-not-an-operator", "a>=1", REQ + "found '=', expected: identifier"),
    ("triple-equals", "a===b", REQ + "found '=', expected: identifier"),
    ("paren-after-equals", "a=(b)", REQ + "found '(', expected: identifier"),
    ("in-without-parens", "a in x", REQ + "found 'x' expected: '('"),
    ("in-at-end", "a in", REQ + "found '' expected: '('"),
    ("unclosed-paren", "a in (x", REQ + "found '', expected: ',' or ')'"),
    ("unclosed-paren-after-comma", "a in (x,", REQ + "found '', expected: ',', or identifier"),
    ("unclosed-empty-paren", "a in (", REQ + "found '', expected: ',', ')' or identifier"),
    ("space-separated-values", "a in (x y)", REQ + "found 'y', expected: ',' or ')'"),
    ("operator-in-set", "a in (x=)", REQ + "found '=', expected: ',' or ')'"),
    ("bang-alone", "!", REQ + "found '', expected: identifier"),
    ("bang-comma", "!,a", REQ + "found ',', expected: identifier"),
    ("not-then-operator", "!a=b", "found '=', expected: ',' or 'end of string'"),
    ("trailing-comma", "a=b,", "found '', expected: identifier after ','"),
    ("double-comma", "a,,b", "found ',', expected: identifier after ','"),
    ("leading-comma", ",a", "found ',', expected: !, identifier, or 'end of string'"),
    ("leading-paren", "(a)", "found '(', expected: !, identifier, or 'end of string'"),
    ("garbage-after-value", "a=b c", "found 'c', expected: ',' or 'end of string'"),
    ("chained-equals", "a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("junk-after-set", "a in (b)(", "found '(', expected: ',' or 'end of string'"),
    ("nul-splits-identifier", "a\0b", REQ + f"found 'b', expected: {OPERATORS}"),
    ("nul-after-comma", "a,\0", "found '', expected: identifier after ','"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_parse_error(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(text)
    assert str(info.value) == message


def test_selector_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="unable to parse requirement"):
        parse_label_selector("a=b@")


# --------------------------------------------------------------------------------------
# Matching.

MATCH_CASES = [
    # (id, selector, labels, expected)
    ("everything-matches-empty", "", {}, True),
    ("everything-matches-any", "", {"a": "b"}, True),
    ("exists-present", "a", {"a": ""}, True),
    ("exists-absent", "a", {"b": "x"}, False),
    ("not-exists-absent", "!a", {"b": "x"}, True),
    ("not-exists-present", "!a", {"a": "x"}, False),
    ("equals-match", "a=b", {"a": "b"}, True),
    ("equals-other-value", "a=b", {"a": "c"}, False),
    ("equals-absent", "a=b", {}, False),
    ("equals-empty-present", "a=", {"a": ""}, True),
    ("equals-empty-absent", "a=", {}, False),
    ("double-equals-match", "a==b", {"a": "b"}, True),
    ("double-equals-other", "a==b", {"a": "x"}, False),
    ("not-equals-other", "a!=b", {"a": "c"}, True),
    ("not-equals-same", "a!=b", {"a": "b"}, False),
    ("not-equals-absent-matches", "a!=b", {}, True),
    ("not-equals-empty-absent", "a!=", {}, True),
    ("not-equals-empty-present", "a!=", {"a": ""}, False),
    ("in-first", "a in (x,y)", {"a": "x"}, True),
    ("in-second", "a in (x,y)", {"a": "y"}, True),
    ("in-other", "a in (x,y)", {"a": "z"}, False),
    ("in-absent", "a in (x,y)", {}, False),
    ("in-single", "a in (x)", {"a": "x"}, True),
    ("in-empty-parens-empty-value", "a in ()", {"a": ""}, True),
    ("in-empty-parens-absent", "a in ()", {}, False),
    ("notin-other", "a notin (x,y)", {"a": "z"}, True),
    ("notin-member", "a notin (x,y)", {"a": "y"}, False),
    ("notin-absent-matches", "a notin (x,y)", {}, True),
    ("notin-single-member", "a notin (x)", {"a": "x"}, False),
    ("gt-greater", "a>5", {"a": "6"}, True),
    ("gt-equal", "a>5", {"a": "5"}, False),
    ("gt-less", "a>5", {"a": "4"}, False),
    ("gt-negative-label", "a>5", {"a": "-10"}, False),
    ("lt-negative-label", "a<0", {"a": "-10"}, True),
    ("gt-plus-sign", "a>5", {"a": "+7"}, True),
    ("gt-leading-zeros", "a>5", {"a": "0010"}, True),
    ("gt-absent", "a>5", {}, False),
    ("gt-non-integer", "a>5", {"a": "six"}, False),
    ("gt-underscore-not-integer", "a>5", {"a": "1_000"}, False),
    ("gt-space-not-integer", "a>5", {"a": " 7"}, False),
    ("gt-overflow-not-integer", "a>5", {"a": "9223372036854775808"}, False),
    ("gt-max-int64", "a>5", {"a": "9223372036854775807"}, True),
    ("gt-non-ascii-digits", "a>5", {"a": "\u0667"}, False),
    ("lt-less", "a<10", {"a": "9"}, True),
    ("lt-equal", "a<10", {"a": "10"}, False),
    ("lt-absent", "a<10", {}, False),
    ("and-all", "a=b,c in (d,e),!f,g", {"a": "b", "c": "e", "g": ""}, True),
    ("and-one-fails", "a=b,c in (d,e),!f,g", {"a": "b", "c": "e", "g": "", "f": "x"}, False),
    ("conflicting-pins", "a=b,a=c", {"a": "b"}, False),
    ("prefixed-key", "example.com/tier in (web)", {"example.com/tier": "web"}, True),
]


@pytest.mark.parametrize(("text", "labels", "expected"), [c[1:] for c in MATCH_CASES], ids=[c[0] for c in MATCH_CASES])
def test_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    sel = parse_label_selector(text)
    assert sel.matches(labels) is expected
    assert all(r.matches(labels) for r in sel.requirements) is expected


# --------------------------------------------------------------------------------------
# exact_value, equality, construction.

EXACT_CASES = [
    ("equals", "a=b", "a", "b"),
    ("double-equals", "a==b", "a", "b"),
    ("single-in", "a in (b)", "a", "b"),
    ("empty-value", "a=", "a", ""),
    ("multi-in", "a in (b,c)", "a", None),
    ("not-equals", "a!=b", "a", None),
    ("notin", "a notin (b)", "a", None),
    ("exists", "a", "a", None),
    ("gt", "a>1", "a", None),
    ("other-key", "a=b", "c", None),
    ("pinned-alongside-other-terms", "a,a=b,c=d", "a", "b"),
    ("everything", "", "a", None),
]


@pytest.mark.parametrize(("text", "key", "expected"), [c[1:] for c in EXACT_CASES], ids=[c[0] for c in EXACT_CASES])
def test_exact_value(text: str, key: str, expected: str | None) -> None:
    assert parse_label_selector(text).exact_value(key) == expected


def test_equality_and_hash_ignore_spelling() -> None:
    a = parse_label_selector("b in (y,x),a")
    b = parse_label_selector(" a ,b in (x, y, x)")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, parse_label_selector("a")}) == 2
    assert a != parse_label_selector("a,b notin (x,y)")
    assert a != "a,b in (x,y)"


def test_everything_is_shared_and_empty() -> None:
    assert parse_label_selector("") is parse_label_selector("  ")
    assert parse_label_selector("").empty
    assert not parse_label_selector("a").empty
    assert LabelSelector() == parse_label_selector("")


def test_requirements_are_frozen() -> None:
    req = parse_label_selector("a=b").requirements[0]
    with pytest.raises(AttributeError):
        req.key = "c"  # type: ignore[misc]


def test_constructor_normalises_and_accepts_plain_strings() -> None:
    req = LabelRequirement("a", "in", ["y", "x", "y"])  # type: ignore[arg-type]
    assert req.operator is Operator.IN
    assert req.values == ("x", "y")
    assert LabelSelector([req]) == parse_label_selector("a in (x,y)")


CONSTRUCTOR_ERRORS = [
    (
        "unsupported-operator",
        ("a", "~", ()),
        'operator: Unsupported value: "~": supported values: "in", "notin", "=", "==", "!=", "gt", "lt", "exists", "!"',
    ),
    (
        "in-without-values",
        ("a", Operator.IN, ()),
        "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty",
    ),
    (
        "equals-two-values",
        ("a", Operator.EQUALS, ("x", "y")),
        'values: Invalid value: ["x","y"]: exact-match compatibility requires one single value',
    ),
    (
        "exists-with-value",
        ("a", Operator.EXISTS, ("x",)),
        'values: Invalid value: ["x"]: values set must be empty for exists and does not exist',
    ),
    (
        "gt-two-values",
        ("a", Operator.GREATER_THAN, ("1", "2")),
        "values: Invalid value: [\"1\",\"2\"]: for 'Gt', 'Lt' operators, exactly one value is required",
    ),
    ("bad-key", ("a b", Operator.EXISTS, ()), 'key: Invalid value: "a b": name part ' + NAME_RULE),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in CONSTRUCTOR_ERRORS], ids=[c[0] for c in CONSTRUCTOR_ERRORS]
)
def test_constructor_errors(args: tuple[str, str, tuple[str, ...]], message: str) -> None:
    with pytest.raises(SelectorError) as info:
        LabelRequirement(*args)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_long_adversarial_input_is_linear() -> None:
    # A backtracking regex would take minutes on this; apimachinery's RE2 does not.
    with pytest.raises(SelectorError):
        parse_label_selector("a" + "-a" * 50_000 + "-/b")
    with pytest.raises(SelectorError):
        parse_label_selector("a=" + "a" * 100_000 + "-")


def test_empty_values_in_a_set_as_apimachinery_parses_them():
    # parseIdentifiersList: "(,", ",)" and ",," stand for "", but ",," then ")" is an error.
    assert parse_label_selector("a in (,)").requirements == parse_label_selector("a in ()").requirements
    assert parse_label_selector("a in (x,,y)").matches({"a": ""})
    assert parse_label_selector("a in (,,x)").matches({"a": ""})
    for bad in ("a in (,,)", "a in (x,,)"):
        with pytest.raises(SelectorError):
            parse_label_selector(bad)


# --------------------------------------------------------------------------------------
# Property: generated selectors round-trip and match like a naive evaluator.

KEYS = ["a", "b", "x-1", "app.kubernetes.io/name", "in", "notin"]
VALUES = ["", "x", "y", "in", "notin", "v.1", "A_b"]
INTS = ["0", "1", "5", "10", "007"]
LABEL_VALUES = [*VALUES, *INTS, "-3", "+7", "1_0", " 5", "99999999999999999999"]

Term = tuple[str, Operator, tuple[str, ...]]

_ws = st.sampled_from(["", " ", "\t", " \n "])
_ws1 = st.sampled_from([" ", "\t", "  ", "\r\n"])


@st.composite
def terms(draw: st.DrawFn) -> tuple[Term, str]:
    """One requirement as (ast, text), the text written with varied spacing."""
    key = draw(st.sampled_from(KEYS))
    op = draw(st.sampled_from(list(Operator)))
    if op is Operator.EXISTS:
        return (key, op, ()), key
    if op is Operator.DOES_NOT_EXIST:
        return (key, op, ()), "!" + draw(_ws) + key
    if op in (Operator.IN, Operator.NOT_IN):
        # Not two empty values last after a third: kube's grammar rejects "(x,,)" and "(,,)" (a test below).
        values = draw(
            st.lists(st.sampled_from(VALUES), min_size=1, max_size=3).filter(
                lambda v: not (len(v) >= 3 and v[-1] == v[-2] == "")
            )
        )
        sep = draw(_ws) + "," + draw(_ws)
        body = sep.join(values) if values != [""] else ""
        text = f"{key}{draw(_ws1)}{op.value}{draw(_ws)}({draw(_ws)}{body}{draw(_ws)})"
        return (key, op, tuple(values)), text
    if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        value = draw(st.sampled_from(INTS))
        symbol = ">" if op is Operator.GREATER_THAN else "<"
    else:
        value = draw(st.sampled_from(VALUES))
        symbol = op.value
    return (key, op, (value,)), f"{key}{draw(_ws)}{symbol}{draw(_ws)}{value}"


@st.composite
def selectors(draw: st.DrawFn) -> tuple[list[Term], str]:
    parts = draw(st.lists(terms(), max_size=4))
    sep = draw(_ws) + "," + draw(_ws)
    text = draw(_ws) + sep.join(t for _, t in parts) + draw(_ws)
    return [ast for ast, _ in parts], text


_INT_RE = re.compile(r"[+-]?[0-9]+")


def _go_int(v: str) -> int | None:
    if not _INT_RE.fullmatch(v):
        return None
    n = int(v)
    return n if -(2**63) <= n < 2**63 else None


def naive_matches(ast: list[Term], labels: Mapping[str, str]) -> bool:
    for key, op, values in ast:
        present = key in labels
        value = labels.get(key)
        if op is Operator.EXISTS:
            ok = present
        elif op is Operator.DOES_NOT_EXIST:
            ok = not present
        elif op in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS):
            ok = present and value in values
        elif op in (Operator.NOT_IN, Operator.NOT_EQUALS):
            ok = not present or value not in values
        else:
            have = _go_int(value) if value is not None else None
            bound = int(values[0])
            ok = have is not None and (have > bound if op is Operator.GREATER_THAN else have < bound)
        if not ok:
            return False
    return True


label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(LABEL_VALUES), max_size=len(KEYS))


@given(selectors(), st.lists(label_sets, min_size=1, max_size=8))
def test_generated_selectors_roundtrip_and_match_naively(
    generated: tuple[list[Term], str], label_samples: list[dict[str, str]]
) -> None:
    ast, text = generated
    sel = parse_label_selector(text)
    assert sel == LabelSelector(LabelRequirement(k, op, v) for k, op, v in ast)
    again = parse_label_selector(str(sel))
    assert again == sel
    assert str(again) == str(sel)
    for labels in label_samples:
        expected = naive_matches(ast, labels)
        assert sel.matches(labels) is expected
        if expected:
            for key in KEYS:
                pinned = sel.exact_value(key)
                assert pinned is None or labels[key] == pinned

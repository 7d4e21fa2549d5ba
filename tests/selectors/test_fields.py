"""Field selectors must accept, reject and match exactly what kube-apiserver does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchcache.selectors import (
    FieldRequirement,
    FieldSelector,
    Operator,
    SelectorError,
    escape_field_value,
    parse_field_selector,
    unescape_field_value,
)

POD_FIELDS = frozenset({"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"})

EQ, NE = Operator.EQUALS, Operator.NOT_EQUALS

PARSE_CASES = [
    # (id, text, [(field, operator, value)], canonical str)
    ("empty", "", [], ""),
    ("only-commas", ",,", [], ""),
    ("equals", "metadata.name=foo", [("metadata.name", EQ, "foo")], "metadata.name=foo"),
    ("double-equals-is-equals", "metadata.name==foo", [("metadata.name", EQ, "foo")], "metadata.name=foo"),
    ("not-equals", "status.phase!=Running", [("status.phase", NE, "Running")], "status.phase!=Running"),
    ("empty-value", "spec.nodeName=", [("spec.nodeName", EQ, "")], "spec.nodeName="),
    ("empty-value-not-equals", "spec.nodeName!=", [("spec.nodeName", NE, "")], "spec.nodeName!="),
    (
        "and-sorted",
        "status.phase=Running,metadata.namespace=default",
        [("metadata.namespace", EQ, "default"), ("status.phase", EQ, "Running")],
        "metadata.namespace=default,status.phase=Running",
    ),
    ("trailing-comma-ignored", "metadata.name=a,", [("metadata.name", EQ, "a")], "metadata.name=a"),
    (
        "empty-term-ignored",
        "metadata.name=a,,spec.nodeName=n",
        [("metadata.name", EQ, "a"), ("spec.nodeName", EQ, "n")],
        "metadata.name=a,spec.nodeName=n",
    ),
    ("escaped-comma", r"metadata.name=a\,b", [("metadata.name", EQ, "a,b")], r"metadata.name=a\,b"),
    ("escaped-equals", r"metadata.name=a\=b", [("metadata.name", EQ, "a=b")], r"metadata.name=a\=b"),
    ("escaped-backslash", r"metadata.name=a\\b", [("metadata.name", EQ, "a\\b")], r"metadata.name=a\\b"),
    (
        "escaped-backslash-then-comma",
        r"metadata.name=a\\,spec.nodeName=n",
        [("metadata.name", EQ, "a\\"), ("spec.nodeName", EQ, "n")],
        r"metadata.name=a\\,spec.nodeName=n",
    ),
    ("bang-in-value", "metadata.name=a!b", [("metadata.name", EQ, "a!b")], "metadata.name=a!b"),
    ("not-equals-in-value-escaped", r"metadata.name=a!\=b", [("metadata.name", EQ, "a!=b")], r"metadata.name=a!\=b"),
    ("value-keeps-spaces", "metadata.name= a b ", [("metadata.name", EQ, " a b ")], "metadata.name= a b "),
    ("value-any-characters", "metadata.name=ä/€(x)", [("metadata.name", EQ, "ä/€(x)")], "metadata.name=ä/€(x)"),
    (
        "same-field-twice",
        "metadata.name=b,metadata.name=a",
        [("metadata.name", EQ, "a"), ("metadata.name", EQ, "b")],
        "metadata.name=a,metadata.name=b",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected", "canonical"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES]
)
def test_parse(text: str, expected: list[tuple[str, Operator, str]], canonical: str) -> None:
    sel = parse_field_selector(text, POD_FIELDS)
    assert [(r.field, r.operator, r.value) for r in sel.requirements] == expected
    assert str(sel) == canonical
    assert sel.empty == (not expected)
    assert parse_field_selector(str(sel), POD_FIELDS) == sel


ERROR_CASES = [
    ("unsupported-field", "foo=bar", "field label not supported: foo"),
    ("unsupported-field-not-equals", "spec.foo!=x", "field label not supported: spec.foo"),
    ("spaces-are-part-of-field", "metadata.name = x", "field label not supported: metadata.name "),
    ("empty-field", "=x", "field label not supported: "),
    ("first-unsupported-in-sorted-order", "zzz=1,aaa=1", "field label not supported: aaa"),
    ("no-operator", "metadata.name", "invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
    (
        "no-operator-among-others",
        "metadata.name=a,bogus",
        "invalid selector: 'metadata.name=a,bogus'; can't understand 'bogus'",
    ),
    ("whitespace-only", " ", "invalid selector: ' '; can't understand ' '"),
    (
        "set-syntax-unsupported",
        "metadata.name in (a)",
        "invalid selector: 'metadata.name in (a)'; can't understand 'metadata.name in (a)'",
    ),
    (
        "greater-than-unsupported",
        "metadata.name>a",
        "invalid selector: 'metadata.name>a'; can't understand 'metadata.name>a'",
    ),
    ("syntax-error-before-unsupported", "aaa=1,zzz", "invalid selector: 'aaa=1,zzz'; can't understand 'zzz'"),
    ("unescaped-equals", "metadata.name=a=b", "invalid field selector: unescaped character in value: 61"),
    ("triple-equals", "metadata.name===b", "invalid field selector: unescaped character in value: 61"),
    ("not-equals-inside-value", "metadata.name=a!=b", "invalid field selector: unescaped character in value: 61"),
    ("invalid-escape", r"metadata.name=a\x", "invalid field selector: invalid escape sequence: \\x"),
    ("escaped-bang-is-invalid", r"metadata.name=a\!b", "invalid field selector: invalid escape sequence: \\!"),
    ("trailing-backslash", "metadata.name=a\\", "invalid field selector: invalid escape sequence: \\"),
    (
        "escape-error-before-unsupported",
        r"aaa=1,metadata.name=\q",
        "invalid field selector: invalid escape sequence: \\q",
    ),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_parse_error(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_field_selector(text, POD_FIELDS)
    assert str(info.value) == message


def test_a_term_empty_on_both_sides_is_dropped_before_fields_are_checked() -> None:
    # apimachinery's ParseSelector drops a term whose field and value are both empty (Transform, with the
    # identity), before the handler converts field labels: kube answers "fieldSelector==" with a 200.
    for text in ("=", "==", "!=", ",=,"):
        assert parse_field_selector(text, {"metadata.name"}).empty, text
    assert str(parse_field_selector("metadata.name=a,==", {"metadata.name"})) == "metadata.name=a"


MATCH_CASES = [
    # (id, selector, fields, expected)
    ("everything", "", {}, True),
    ("equals-match", "metadata.name=foo", {"metadata.name": "foo"}, True),
    ("equals-other", "metadata.name=foo", {"metadata.name": "bar"}, False),
    ("equals-missing", "metadata.name=foo", {}, False),
    ("equals-empty-missing-counts-as-empty", "spec.nodeName=", {}, True),
    ("equals-empty-set", "spec.nodeName=", {"spec.nodeName": "n1"}, False),
    ("double-equals-match", "metadata.name==foo", {"metadata.name": "foo"}, True),
    ("not-equals-other", "status.phase!=Running", {"status.phase": "Pending"}, True),
    ("not-equals-same", "status.phase!=Running", {"status.phase": "Running"}, False),
    ("not-equals-missing", "status.phase!=Running", {}, True),
    ("not-equals-empty-missing", "spec.nodeName!=", {}, False),
    ("not-equals-empty-set", "spec.nodeName!=", {"spec.nodeName": "n1"}, True),
    ("escaped-value", r"metadata.name=a\,b\=c", {"metadata.name": "a,b=c"}, True),
    ("escaped-value-raw-does-not-match", r"metadata.name=a\,b", {"metadata.name": r"a\,b"}, False),
    (
        "and-all",
        "metadata.namespace=ns,status.phase!=Failed",
        {"metadata.namespace": "ns", "status.phase": "Running"},
        True,
    ),
    (
        "and-one-fails",
        "metadata.namespace=ns,status.phase!=Failed",
        {"metadata.namespace": "ns", "status.phase": "Failed"},
        False,
    ),
    ("conflicting-pins", "metadata.name=a,metadata.name=b", {"metadata.name": "a"}, False),
]


@pytest.mark.parametrize(("text", "fields", "expected"), [c[1:] for c in MATCH_CASES], ids=[c[0] for c in MATCH_CASES])
def test_matches(text: str, fields: dict[str, str], expected: bool) -> None:
    sel = parse_field_selector(text, POD_FIELDS)
    assert sel.matches(fields) is expected
    assert all(r.matches(fields) for r in sel.requirements) is expected


EXACT_CASES = [
    ("equals", "metadata.name=foo", "metadata.name", "foo"),
    ("double-equals", "metadata.name==foo", "metadata.name", "foo"),
    ("empty-value", "spec.nodeName=", "spec.nodeName", ""),
    ("escaped", r"metadata.name=a\,b", "metadata.name", "a,b"),
    ("not-equals", "metadata.name!=foo", "metadata.name", None),
    ("other-field", "metadata.namespace=ns", "metadata.name", None),
    ("among-others", "metadata.namespace=ns,metadata.name=foo", "metadata.name", "foo"),
    ("everything", "", "metadata.name", None),
]


@pytest.mark.parametrize(("text", "field", "expected"), [c[1:] for c in EXACT_CASES], ids=[c[0] for c in EXACT_CASES])
def test_exact_value(text: str, field: str, expected: str | None) -> None:
    assert parse_field_selector(text, POD_FIELDS).exact_value(field) == expected


def test_equality_and_hash_ignore_spelling() -> None:
    a = parse_field_selector("status.phase=Running,metadata.name==x", POD_FIELDS)
    b = parse_field_selector("metadata.name=x,,status.phase==Running", POD_FIELDS)
    assert a == b
    assert hash(a) == hash(b)
    assert a != parse_field_selector("metadata.name=x", POD_FIELDS)
    assert a != str(a)


def test_everything_is_empty() -> None:
    assert parse_field_selector("", POD_FIELDS).empty
    assert parse_field_selector(",", ()).empty
    assert FieldSelector() == parse_field_selector("", POD_FIELDS)
    assert not parse_field_selector("metadata.name=x", POD_FIELDS).empty


def test_requirement_rejects_other_operators() -> None:
    with pytest.raises(SelectorError):
        FieldRequirement("metadata.name", Operator.IN, "x")


ESCAPE_CASES = [
    ("plain", "abc", "abc"),
    ("comma", "a,b", r"a\,b"),
    ("equals", "a=b", r"a\=b"),
    ("backslash", "a\\b", r"a\\b"),
    ("bang-untouched", "a!b", "a!b"),
    ("all", "\\,=", r"\\\,\="),
]


@pytest.mark.parametrize(("raw", "escaped"), [c[1:] for c in ESCAPE_CASES], ids=[c[0] for c in ESCAPE_CASES])
def test_escape(raw: str, escaped: str) -> None:
    assert escape_field_value(raw) == escaped
    assert unescape_field_value(escaped) == raw


FIELDS = sorted(POD_FIELDS)


@given(
    st.lists(st.tuples(st.sampled_from(FIELDS), st.sampled_from(["=", "==", "!="]), st.text(max_size=8)), max_size=4),
    st.lists(st.dictionaries(st.sampled_from(FIELDS), st.text(max_size=8)), min_size=1, max_size=6),
)
def test_generated_selectors_roundtrip_and_match_naively(
    terms: list[tuple[str, str, str]], samples: list[dict[str, str]]
) -> None:
    text = ",".join(f"{field}{op}{escape_field_value(value)}" for field, op, value in terms)
    sel = parse_field_selector(text, POD_FIELDS)
    assert sel == FieldSelector(FieldRequirement(f, Operator(op), v) for f, op, v in terms if (f, v) != ("", ""))
    assert parse_field_selector(str(sel), POD_FIELDS) == sel
    for fields in samples:
        expected = all((fields.get(f, "") == v) if op != "!=" else (fields.get(f, "") != v) for f, op, v in terms)
        assert sel.matches(fields) is expected
        if expected:
            for field in FIELDS:
                pinned = sel.exact_value(field)
                assert pinned is None or fields.get(field, "") == pinned

"""shardSelector parsing: kube v1.36's grammar, normalization and messages, case by case.

Every message below is what kube-apiserver v1.36 (ShardedListAndWatch=true) answered for the
same input (after its ``invalid shard selector: `` prefix); tests/reference/test_shard_selector.py
checks them against a live one.
"""

from __future__ import annotations

import pytest

from watchcache.selectors.shards import (
    NAMESPACE,
    UID,
    ShardSelector,
    ShardSelectorError,
    fnv1a_64,
    parse_shard_selector,
)

LO = "'0x0000000000000000'"
MID = "'0x8000000000000000'"
TOP = "'0x10000000000000000'"
U = f"shardRange(object.metadata.uid, {LO}, {MID})"
U_TEXT = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"

ACCEPTED = [
    pytest.param(U, U_TEXT, id="half"),
    pytest.param(f"shardRange(object.metadata.uid, {MID}, {TOP})", f"shardRange({UID}, {MID}, {TOP})", id="to-2^64"),
    pytest.param(f"  ( {U} )  // a comment", U_TEXT, id="parens-space-comment"),
    pytest.param(f"x.{U}", U_TEXT, id="member-call-target-ignored"),
    pytest.param(f"!!{U}", U_TEXT, id="even-negations-cancel"),
    pytest.param(
        "shardRange(object.metadata.uid, '\\x30x0000000000000000', r'0x8000000000000000')", U_TEXT, id="escapes-raw"
    ),
    pytest.param("shardRange(object.metadata.uid, '''0x0000000000000000''', \"0x8000000000000000\")", U_TEXT,
                 id="triple-and-double-quotes"),
    pytest.param(
        f"shardRange( object . metadata.uid,{LO},{MID} )||(shardRange(object.metadata.uid,'0x9000000000000000',{TOP}))",
        f"{U_TEXT} || shardRange({UID}, '0x9000000000000000', {TOP})",
        id="two-ranges-normalized",
    ),
    pytest.param(f"{U} || {U}", f"{U_TEXT} || {U_TEXT}", id="overlapping-kept"),
    pytest.param(f"shardRange(object.metadata.namespace, {LO}, {MID})", f"shardRange({NAMESPACE}, {LO}, {MID})",
                 id="namespace"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "normalized"), ACCEPTED)
def test_accepted_selectors_echo_kubes_normalized_string(text: str, normalized: str) -> None:
    assert parse_shard_selector(text).text == normalized


def hx(value: str) -> str:
    return f"shardRange(object.metadata.uid, {value}, {MID})"


REFUSED = [
    (" ", "empty shard selector is not allowed; omit the parameter for unfiltered lists"),
    ("1", "unexpected expression kind 5; expected shardRange() call or || operator"),
    ("object", "unexpected expression kind 3; expected shardRange() call or || operator"),
    ("object.metadata.uid", "unexpected expression kind 7; expected shardRange() call or || operator"),
    (f"[{U}]", "unexpected expression kind 4; expected shardRange() call or || operator"),
    (f"{{1: {U}}}", "unexpected expression kind 6; expected shardRange() call or || operator"),
    ("a{b: 1}", "unexpected expression kind 8; expected shardRange() call or || operator"),
    (f"{U} || 1", "unexpected expression kind 5; expected shardRange() call or || operator"),
    ("foo(1)", 'unsupported function "foo"; only shardRange() and || are allowed'),
    (f"!{U}", 'unsupported function "!_"; only shardRange() and || are allowed'),
    (f"-{U}", 'unsupported function "-_"; only shardRange() and || are allowed'),
    (f"{U} ? 1 : 2", 'unsupported function "_?_:_"; only shardRange() and || are allowed'),
    (f"{U} || {U} && {U}", 'unsupported function "_&&_"; only shardRange() and || are allowed'),
    (f"shardrange(object.metadata.uid, {LO}, {MID})",
     'unsupported function "shardrange"; only shardRange() and || are allowed'),
    (f"shardRange(object['metadata'].uid, {LO}, {MID})",
     "shardRange() first argument: expected field path (e.g. object.metadata.uid), got expression kind 1"),
    (f"shardRange(1, {LO}, {MID})",
     "shardRange() first argument: expected field path (e.g. object.metadata.uid), got expression kind 5"),
    (f"shardRange(object.metadata.name, {LO}, {MID})",
     'unsupported field path "object.metadata.name"; supported: object.metadata.uid, object.metadata.namespace'),
    (f"shardRange(.object.metadata.uid, {LO}, {MID})",
     'unsupported field path ".object.metadata.uid"; supported: object.metadata.uid, object.metadata.namespace'),
    (f"shardRange(object.metadata.uid, {LO})", "shardRange() requires exactly 3 arguments, got 2"),
    ("shardRange()", "shardRange() requires exactly 3 arguments, got 0"),
    (hx("0"), "hexStart must be a string literal, got int64"),
    (hx("1u"), "hexStart must be a string literal, got uint64"),
    (hx("1.5"), "hexStart must be a string literal, got float64"),
    (hx("true"), "hexStart must be a string literal, got bool"),
    (hx("null"), "hexStart must be a string literal, got structpb.NullValue"),
    (hx("b'0x0000000000000000'"), "hexStart must be a string literal, got []uint8"),
    (hx("x"), "hexStart must be a string literal (e.g. '0xff'), got expression kind 3"),
    (hx("''"), "hexStart must have '0x' prefix, got \"\""),
    (hx("'0X0000000000000000'"), "hexStart must have '0x' prefix, got \"0X0000000000000000\""),
    (hx("'0x'"), "hexStart: hex value is required after '0x'"),
    (hx("'0x000000000000000000'"), 'hexStart: hex value too long (18 chars, max 17): "000000000000000000"'),
    (hx("'0x1000000000000000A'"), 'hexStart: invalid hex character "A" in "0x1000000000000000A"'),
    (hx("'0xé000000000000000'"), 'hexStart: invalid hex character "é" in "0xé000000000000000"'),
    (hx("'0x10000000000000001'"),
     "hexStart: 17-digit hex value must be '0x10000000000000000' (2^64), got \"0x10000000000000001\""),
    (hx("'0x0'"),
     'hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" (did you mean "0x0000000000000000"?)'),
    (f"shardRange(object.metadata.uid, {LO}, '0xFFFFFFFFFFFFFFFF')",
     'hexEnd: invalid hex character "F" in "0xFFFFFFFFFFFFFFFF"'),
    (f"shardRange(object.metadata.uid, {MID}, {LO})",
     "shard range start 0x8000000000000000 must be less than end 0x0000000000000000"),
    (f"shardRange(object.metadata.uid, {TOP}, {TOP})",
     "shard range start 0x10000000000000000 must be less than end 0x10000000000000000"),
    (f"shardRange(object.metadata.uid, {LO}, {TOP}) || shardRange(object.metadata.namespace, {LO}, {TOP})",
     'all shard ranges must use the same field, got "object.metadata.uid" and "object.metadata.namespace"'),
    ("if", "CEL parse error: reserved identifier: if"),
    ("shardRange(",
     "CEL parse error: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', ')', '.', '-', '!', "
     "'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}"),
    (f"shardRange(object.metadata.uid, {LO}, {MID},)",
     "CEL parse error: Syntax error: mismatched input ')' expecting {'[', '{', '(', '.', '-', '!', "
     "'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[m[:48] for _, m in REFUSED])
def test_refused_selectors_say_what_kube_says(text: str, message: str) -> None:
    with pytest.raises(ShardSelectorError) as err:
        parse_shard_selector(text)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "text",
    ["shardRange(", "'unterminated", "a +", "a.", "(a", "a[1", "{1:", "#", "a b", "1e", "0x", "'\\q'", "((((" * 80],
)
def test_malformed_input_is_a_cel_parse_error_never_a_crash(text: str) -> None:
    with pytest.raises(ShardSelectorError) as err:
        parse_shard_selector(text)
    assert str(err.value).startswith(("CEL parse error: ", "unexpected expression kind", "unsupported function"))


def test_fnv1a_64_is_gos_hash_fnv_new64a() -> None:
    # Test vectors of the FNV reference (draft-eastlake-fnv), as Go's hash/fnv computes them.
    assert fnv1a_64("") == 0xCBF29CE484222325
    assert fnv1a_64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64("foobar") == 0x85944171F73967E8
    # Seen on kube-apiserver v1.36: this uid is in the lower half, the next one in the upper.
    assert fnv1a_64("e053fe0c-3b1f-4287-899c-bca9a10f8dc2") == 0x265EED416078C8B4
    assert fnv1a_64("5995c368-4108-40a4-9c06-d8bb7d83ba4c") == 0xFAD5E8F507AC1309


def test_ranges_are_start_inclusive_end_exclusive() -> None:
    sel = parse_shard_selector(f"shardRange(object.metadata.uid, {MID}, {TOP})")
    assert sel.contains(0x8000000000000000)
    assert sel.contains(0xFFFFFFFFFFFFFFFF)
    assert not sel.contains(0x7FFFFFFFFFFFFFFF)
    lower = parse_shard_selector(U)
    assert lower.contains(0) and not lower.contains(0x8000000000000000)


def test_selectors_are_equal_by_their_normalized_text() -> None:
    a = parse_shard_selector(U)
    b = parse_shard_selector(f"( {U} )")
    assert a == b and hash(a) == hash(b)
    assert a != parse_shard_selector(f"shardRange(object.metadata.uid, {MID}, {TOP})")
    with pytest.raises(ValueError):
        ShardSelector(())

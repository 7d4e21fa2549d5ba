"""A request target read as kube-apiserver reads it: the query as Go's ``url.ParseQuery`` (errors
ignored), the path for display only (routing reads the raw path: tests/http/test_routing.py)."""

from __future__ import annotations

import pytest

from watchcache.http.request import GO_MAX_QUERY_PARAMS, parse_query, split_target

# (query as sent, what kube-apiserver's req.URL.Query() holds, every key and value UTF-8)
GO_QUERIES = [
    pytest.param(b"limit=500&resourceVersion=0", {"limit": ["500"], "resourceVersion": ["0"]}, True, id="plain"),
    pytest.param(b"a=1&a=2&b=&c", {"a": ["1", "2"], "b": [""], "c": [""]}, True, id="repeated-blank-bare"),
    pytest.param(b"&&limit=1&&", {"limit": ["1"]}, True, id="empty-pairs-skipped"),
    pytest.param(b"=x", {"": ["x"]}, True, id="empty-key"),
    pytest.param(b"labelSelector=a%3Db%2Cc+in+(d)", {"labelSelector": ["a=b,c in (d)"]}, True, id="escapes-plus"),
    pytest.param(b"c=x%2By+z", {"c": ["x+y z"]}, True, id="encoded-plus-stays"),
    pytest.param(b"k%61y=v", {"kay": ["v"]}, True, id="escaped-key"),
    # A bad escape in the key or value drops the pair (QueryUnescape's EscapeError), not the query.
    pytest.param(b"labelSelector=%zz", {}, True, id="bad-escape-dropped"),
    pytest.param(b"labelSelector=%zz&limit=1", {"limit": ["1"]}, True, id="bad-escape-others-kept"),
    pytest.param(
        b"resourceVersionMatch=NotOlderThan&continue=%%%",
        {"resourceVersionMatch": ["NotOlderThan"]},
        True,
        id="continue-percent-dropped",
    ),
    pytest.param(b"a=%4", {}, True, id="truncated-escape"),
    pytest.param(b"a=%41", {"a": ["A"]}, True, id="escape-at-end"),
    pytest.param(b"%zz=1&b=2", {"b": ["2"]}, True, id="bad-escape-in-key"),
    # A pair holding a ';' is dropped (Go 1.17+: "invalid semicolon separator in query").
    pytest.param(b"labelSelector=team%3Dred;x", {}, True, id="semicolon-dropped"),
    pytest.param(b"limit=1;labelSelector=x", {}, True, id="semicolon-not-a-separator"),
    pytest.param(b"limit=1;x&watch=1", {"watch": ["1"]}, True, id="semicolon-others-kept"),
    pytest.param(b"a=%3B", {"a": [";"]}, True, id="encoded-semicolon-kept"),
    # Values are bytes to Go: one that is not UTF-8 is flagged (the request passes through).
    pytest.param(b"labelSelector=team%3D%FF", {"labelSelector": ["team=\ufffd"]}, False, id="escape-not-utf8"),
    pytest.param(b"%FF=1", {"\ufffd": ["1"]}, False, id="key-not-utf8"),
    pytest.param(b"a=r\xc3\xa9", {"a": ["r\u00e9"]}, True, id="raw-utf8"),
    pytest.param(b"a=r\xff&b=1", {"a": ["r\ufffd"], "b": ["1"]}, False, id="raw-not-utf8"),
    pytest.param(b"a=%C3%A9", {"a": ["\u00e9"]}, True, id="escaped-utf8"),
    pytest.param(b"a=%00", {"a": ["\x00"]}, True, id="nul"),
    pytest.param(b"a=%FF;x", {}, True, id="not-utf8-but-dropped"),
]


@pytest.mark.parametrize(("query", "expected", "utf8"), GO_QUERIES)
def test_a_query_is_read_as_gos_parse_query_reads_it(query: bytes, expected: dict[str, list[str]], utf8: bool) -> None:
    assert parse_query(query) == (expected, utf8)


def test_past_gos_parameter_limit_the_query_is_empty() -> None:
    # Go's defaultMaxParams: with more parts than that, ParseQuery returns nothing (checked on the kit).
    within = b"limit=1" + b"&" * (GO_MAX_QUERY_PARAMS - 1)
    assert parse_query(within) == ({"limit": ["1"]}, True)
    assert parse_query(within + b"&") == ({}, True)


def test_split_target_never_refuses_bytes_kube_reads() -> None:
    # kube 404s ``/a%ff`` (its mux), and answers ``?x=%FF``: neither is a 400 at the protocol.
    assert split_target(b"/a%ff?x=%FF") == ("/a\ufffd", {"x": ["\ufffd"]}, False)
    assert split_target(b"/a\xff%zz?y=1") == ("/a\ufffd%zz", {"y": ["1"]}, True)
    assert split_target(b"/api/v1/na%20me?a=1") == ("/api/v1/na me", {"a": ["1"]}, True)
    assert split_target(b"*") == ("*", {}, True)
    assert split_target(b"http://h/p?q=1") == ("/p", {"q": ["1"]}, True)
    with pytest.raises(ValueError):
        split_target(b"http://[")

"""``header_line``: the one place a header is encoded for a client, so it refuses what RFC 9110 refuses."""

from __future__ import annotations

import pytest

from watchcache.http.h1response import header_line

# RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~"
# / DIGIT / ALPHA.
TCHAR = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@pytest.mark.parametrize("code", range(0x180))
def test_a_name_is_a_token_every_character_checked(code: int) -> None:
    c = chr(code)
    for name in (c, f"X-{c}", f"{c}-Y"):
        if c in TCHAR:
            assert header_line(name, "v") == f"{name}: v\r\n".encode("latin-1")
        else:
            with pytest.raises(ValueError, match="invalid header name"):
                header_line(name, "v")


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid header name"):
        header_line("", "v")


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "a\x00b", "\r\nX-Injected: 1"])
def test_a_value_that_would_end_its_line_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="invalid header value"):
        header_line("X-Ok", value)


def test_values_go_out_as_latin_1_text_one_byte_per_character() -> None:
    # A passed-through value is latin-1 text (one character per byte received): written back as those bytes.
    assert header_line("Warning", '299 - "\xe2\x82\xac"\t') == b'Warning: 299 - "\xe2\x82\xac"\t\r\n'

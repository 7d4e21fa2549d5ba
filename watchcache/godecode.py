"""Go's base64 and ``encoding/json`` errors, word for word, for the messages kube builds from them.

kube-apiserver answers an undecodable continue token with ``invalid continue token: continue key is
not valid: <Go's error>`` (``storage.DecodeContinue``): ``illegal base64 data at input byte 0``,
``invalid character 'o' in literal null (expecting 'u')``, ``json: cannot unmarshal string into Go
struct field continueToken.rv of type int64``. Python's decoders word the same faults differently
(and some of their words are internals: ``str is not valid UTF-8: surrogates not allowed``), and
accept or refuse other inputs: Python's base64 skips characters outside the alphabet and takes
padding, Go's ``RawURLEncoding`` refuses both; Go's JSON takes invalid UTF-8 and lone surrogate
escapes in strings (as U+FFFD), orjson refuses them. So the token is decoded here as Go decodes it:
``raw_url_b64decode`` is Go's decoder, ``check_json`` is Go's scanner (``encoding/json/scanner.go``:
the same states, the same first error), ``loads`` reads what the scanner passed as Go would.
"""

from __future__ import annotations

import base64
import json
import string
from collections.abc import Callable
from typing import Any

from watchcache.quoting import go_quote

_B64_ALPHABET = frozenset((string.ascii_letters + string.digits + "-_").encode())
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SPACE = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
# encoding/json's maxNestingDepth.
_MAX_DEPTH = 10_000


class GoDecodeError(ValueError):
    """A decoding error, its message as Go's."""


def raw_url_b64decode(data: bytes) -> bytes:
    """``base64.RawURLEncoding.DecodeString``: the URL alphabet, no padding; CR and LF skipped (as Go does)."""
    for i, c in enumerate(data):
        if c not in _B64_ALPHABET and c not in b"\r\n":
            raise GoDecodeError(f"illegal base64 data at input byte {i}")
    text = bytes(c for c in data if c in _B64_ALPHABET)
    if len(text) % 4 == 1:  # a quantum of one character: Go's CorruptInputError(si - j)
        raise GoDecodeError(f"illegal base64 data at input byte {len(data) - 1}")
    return base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))


def _quote_char(c: int) -> str:
    """encoding/json's ``quoteChar``: the byte as a rune (Latin-1), in single quotes."""
    if c == ord("'"):
        return "'\\''"
    if c == ord('"'):
        return "'\"'"
    return "'" + go_quote(chr(c))[1:-1] + "'"


class _Scanner:
    """encoding/json's scanner: ``step`` is the state function for the next byte."""

    OBJECT_KEY, OBJECT_VALUE, ARRAY_VALUE = 0, 1, 2

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.step: Callable[[int], None] = self.begin_value
        self.end_top = False

    def fail(self, c: int, context: str) -> None:
        raise GoDecodeError(f"invalid character {_quote_char(c)} {context}")

    def push(self, kind: int, c: int) -> None:
        self.stack.append(kind)
        if len(self.stack) > _MAX_DEPTH:
            self.fail(c, "exceeded max depth")

    def pop(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.step, self.end_top = self.end_top_state, True
        else:
            self.step = self.end_value

    def begin_value_or_empty(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == ord("]"):
            self.end_value(c)
            return
        self.begin_value(c)

    def begin_value(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == ord("{"):
            self.push(self.OBJECT_KEY, c)
            self.step = self.begin_string_or_empty
        elif c == ord("["):
            self.push(self.ARRAY_VALUE, c)
            self.step = self.begin_value_or_empty
        elif c == ord('"'):
            self.step = self.in_string
        elif c == ord("-"):
            self.step = self.neg
        elif c == ord("0"):
            self.step = self.zero
        elif c in b"123456789":
            self.step = self.one
        elif c == ord("t"):
            self.step = self.literal(b"rue", "true")
        elif c == ord("f"):
            self.step = self.literal(b"alse", "false")
        elif c == ord("n"):
            self.step = self.literal(b"ull", "null")
        else:
            self.fail(c, "looking for beginning of value")

    def begin_string_or_empty(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == ord("}"):
            self.stack[-1] = self.OBJECT_VALUE
            self.end_value(c)
            return
        self.begin_string(c)

    def begin_string(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == ord('"'):
            self.step = self.in_string
            return
        self.fail(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> None:
        if not self.stack:
            self.step, self.end_top = self.end_top_state, True
            self.end_top_state(c)
            return
        if c in _SPACE:
            self.step = self.end_value
            return
        kind = self.stack[-1]
        if kind == self.OBJECT_KEY:
            if c == ord(":"):
                self.stack[-1] = self.OBJECT_VALUE
                self.step = self.begin_value
                return
            self.fail(c, "after object key")
        elif kind == self.OBJECT_VALUE:
            if c == ord(","):
                self.stack[-1] = self.OBJECT_KEY
                self.step = self.begin_string
                return
            if c == ord("}"):
                self.pop()
                return
            self.fail(c, "after object key:value pair")
        else:
            if c == ord(","):
                self.step = self.begin_value
                return
            if c == ord("]"):
                self.pop()
                return
            self.fail(c, "after array element")

    def end_top_state(self, c: int) -> None:
        if c not in _SPACE:
            self.fail(c, "after top-level value")

    def in_string(self, c: int) -> None:
        if c == ord('"'):
            self.step = self.end_value
        elif c == ord("\\"):
            self.step = self.in_string_escape
        elif c < 0x20:
            self.fail(c, "in string literal")

    def in_string_escape(self, c: int) -> None:
        if c in b'bfnrt\\/"':
            self.step = self.in_string
        elif c == ord("u"):
            self.step = self.unicode_escape(4)
        else:
            self.fail(c, "in string escape code")

    def unicode_escape(self, left: int) -> Callable[[int], None]:
        def state(c: int) -> None:
            if c not in _HEX:
                self.fail(c, "in \\u hexadecimal character escape")
            self.step = self.in_string if left == 1 else self.unicode_escape(left - 1)

        return state

    def neg(self, c: int) -> None:
        if c == ord("0"):
            self.step = self.zero
        elif c in b"123456789":
            self.step = self.one
        else:
            self.fail(c, "in numeric literal")

    def one(self, c: int) -> None:
        if c in _DIGITS:
            return
        self.zero(c)

    def zero(self, c: int) -> None:
        if c == ord("."):
            self.step = self.dot
        elif c in b"eE":
            self.step = self.exponent
        else:
            self.end_value(c)

    def dot(self, c: int) -> None:
        if c in _DIGITS:
            self.step = self.dot_digits
            return
        self.fail(c, "after decimal point in numeric literal")

    def dot_digits(self, c: int) -> None:
        if c in _DIGITS:
            return
        if c in b"eE":
            self.step = self.exponent
            return
        self.end_value(c)

    def exponent(self, c: int) -> None:
        if c in b"+-":
            self.step = self.exponent_sign
            return
        self.exponent_sign(c)

    def exponent_sign(self, c: int) -> None:
        if c in _DIGITS:
            self.step = self.exponent_digits
            return
        self.fail(c, "in exponent of numeric literal")

    def exponent_digits(self, c: int) -> None:
        if c not in _DIGITS:
            self.end_value(c)

    def literal(self, rest: bytes, name: str) -> Callable[[int], None]:
        def state(c: int) -> None:
            if c != rest[0]:
                self.fail(c, f"in literal {name} (expecting {_quote_char(rest[0])})")
            self.step = self.end_value if len(rest) == 1 else self.literal(rest[1:], name)

        return state


def check_json(data: bytes) -> None:
    """encoding/json's ``checkValid``: GoDecodeError with Go's message for the first syntax error."""
    scanner = _Scanner()
    for c in data:
        scanner.step(c)
    if scanner.end_top:
        return
    scanner.step(ord(" "))  # as Go's eof(): a number at the end of the input ends here
    if not scanner.end_top:
        raise GoDecodeError("unexpected end of JSON input")


def loads(data: bytes) -> Any:
    """A document ``check_json`` passed, read as Go reads it: invalid UTF-8 and lone surrogate escapes in
    strings become U+FFFD (``without_surrogates``); objects are ``JsonObject`` pairs in document order
    (Go applies duplicates in turn); numbers keep their literal text (``JsonNumber``)."""
    text = data.decode("utf-8", errors="replace")
    return json.loads(text, object_pairs_hook=JsonObject, parse_float=JsonNumber, parse_int=JsonNumber)


class JsonObject(list[tuple[str, Any]]):
    """An object's (key, value) pairs, in document order."""


class JsonNumber(str):
    """A number's literal text, as Go keeps it for its messages (``number 5.5``)."""


def go_type(value: Any) -> str:
    """The JSON type name of ``value`` in Go's ``UnmarshalTypeError`` (``cannot unmarshal <it> into``)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, JsonNumber):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, JsonObject):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null"


def without_surrogates(text: str) -> str:
    """Lone surrogates (from ``\\ud800`` escapes) as Go decodes them: U+FFFD."""
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)

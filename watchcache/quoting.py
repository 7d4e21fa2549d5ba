"""Go's ``%q`` of a string (``strconv.Quote``), as apimachinery prints names and values in messages.

Field errors (``Invalid value: "x"``), authorization denials (``User "alice" cannot ...``) and
selector errors quote with it; clients match those messages, so ours are byte-for-byte Go's:
printable runes as they are, ``\\"`` and ``\\\\``, C escapes for the usual control characters,
``\\xNN`` for other ASCII, ``\\uNNNN`` / ``\\UNNNNNNNN`` for other unprintable runes.
"""

from __future__ import annotations

from typing import Final

_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def go_quote(text: str) -> str:
    """``strconv.Quote(text)``. Python's ``isprintable`` and Go's ``IsPrint`` agree: letters, marks,
    numbers, punctuation, symbols and the ASCII space."""
    out = ['"']
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch.isprintable():
            out.append(ch)
        elif (c := ord(ch)) < 0x80:
            out.append(f"\\x{c:02x}")
        elif c <= 0xFFFF:
            out.append(f"\\u{c:04x}")
        else:
            out.append(f"\\U{c:08x}")
    out.append('"')
    return "".join(out)


def go_json_escape(body: bytes) -> bytes:
    """Go's encoding/json escapes of ``<``, ``>``, ``&``, U+2028 and U+2029 applied to JSON that orjson
    wrote (it leaves them as they are). A byte replace is exact: they can only occur inside strings."""
    if b"<" in body or b">" in body or b"&" in body or b"\xe2\x80" in body:
        body = (
            body.replace(b"<", b"\\u003c")
            .replace(b">", b"\\u003e")
            .replace(b"&", b"\\u0026")
            .replace(b"\xe2\x80\xa8", b"\\u2028")
            .replace(b"\xe2\x80\xa9", b"\\u2029")
        )
    return body

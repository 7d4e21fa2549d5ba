"""Go's formatting of decoded JSON values, where a Table cell shows it.

kube-apiserver writes Table cells with ``encoding/json`` (HTML characters escaped as
``\\u003c``…, floats without a trailing ``.0``), and a custom resource's string column
prints what its JSONPath finds with ``fmt.Fprint`` (``1e+06`` for a float) or, for a map
or a list, ``json.Marshal`` (keys sorted). Values here are what ``orjson.loads`` returns:
dict, list, str, int, float, bool, None — the Go side's unstructured
``map[string]interface{}``, ``[]interface{}``, string, int64, float64, bool, nil.
"""

from __future__ import annotations

import math
from typing import Any

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
for _c in range(0x20):
    _ESCAPES.setdefault(chr(_c), f"\\u{_c:04x}")
_TABLE = str.maketrans(_ESCAPES)


def json_string(s: str) -> str:
    """``s`` as ``encoding/json`` writes a string (quotes included)."""
    return '"' + s.translate(_TABLE) + '"'


def _shortest(f: float) -> tuple[str, int]:
    """The shortest digits of ``f`` (> 0) that round-trip (Go's and Python's ``repr`` agree), and the
    position of the decimal point: ``f == 0.DIGITS × 10**point``."""
    mant, _, exp = repr(f).partition("e")
    int_part, _, frac = mant.partition(".")
    digits = int_part + frac
    point = len(int_part) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    return stripped.rstrip("0") or "0", point


def _fmt_e(neg: bool, digits: str, point: int, exp_width: int = 2) -> str:
    exp = point - 1
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    sign = "-" if exp < 0 else "+"
    return ("-" if neg else "") + mant + "e" + sign + str(abs(exp)).rjust(exp_width, "0")


def _fmt_f(neg: bool, digits: str, point: int) -> str:
    if point <= 0:
        out = "0." + "0" * (-point) + digits
    elif point >= len(digits):
        out = digits + "0" * (point - len(digits))
    else:
        out = digits[:point] + "." + digits[point:]
    return ("-" if neg else "") + out


def go_print_float(f: float) -> str:
    """``fmt.Sprint(f)`` (``%v``: strconv ``'g'``, shortest, exponent from 1e+06 and below 1e-04)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    digits, point = _shortest(abs(f))
    exp = point - 1
    if exp < -4 or exp >= 6:  # strconv: shortest 'g' decides with precision 6
        return _fmt_e(f < 0, digits, point)
    return _fmt_f(f < 0, digits, point)


def go_json_float(f: float) -> str:
    """``json.Marshal(f)``: plain decimal unless |f| < 1e-6 or >= 1e21 (then ``1e-7``, ``1e+21``)."""
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {f}")
    digits, point = _shortest(abs(f))
    a = abs(f)
    if a < 1e-6 or a >= 1e21:
        out = _fmt_e(f < 0, digits, point, 2)
        # encoding/json cleans up e-07 to e-7
        if len(out) >= 4 and out[-4] == "e" and out[-3] == "-" and out[-2] == "0":
            out = out[:-2] + out[-1]
        return out
    return _fmt_f(f < 0, digits, point)


def go_json(value: Any) -> str:
    """``json.Marshal(value)`` for a decoded JSON value (maps with sorted keys, HTML escaped)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_json_float(value)
    if isinstance(value, dict):
        return "{" + ",".join(json_string(k) + ":" + go_json(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def go_print(value: Any) -> str:
    """``fmt.Fprint`` of a decoded JSON scalar, as client-go's jsonpath prints it (``evalToText``)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_print_float(value)
    if value is None:
        return "<nil>"
    return go_json(value)

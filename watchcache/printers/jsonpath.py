"""client-go's JSONPath (``k8s.io/client-go/util/jsonpath``), as a CRD's printer columns use it.

kube-apiserver evaluates each ``additionalPrinterColumns[].jsonPath`` with this dialect (not
RFC 9535): ``{.spec.replicas}``, ``{.status.conditions[?(@.type=="Ready")].status}``,
``{.items[0:2]}``, unions ``[a,b]``, quoted keys ``['a.b']``. The parser and the evaluation
follow the Go code step by step, errors included, because an error there is an empty cell in
kube's Table. Values are decoded JSON (dict, list, str, int, float, bool, None).

Not reproduced, and refused at ``compile`` (the proxy then passes the Table request through):
``*`` over an object and ``..`` (Go walks a map in random order: kube's own cell is not
deterministic), and the ``range``/``end`` template keywords.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

EOF = ""


class JSONPathError(ValueError):
    """A path kube-apiserver would not parse, or one this port does not evaluate (see module doc)."""


class EvalError(Exception):
    """An evaluation error (kube: an empty cell). ``value``: what the Go function returns with it,
    which an ``exists`` filter still looks at."""

    def __init__(self, message: str, value: list[Any]) -> None:
        super().__init__(message)
        self.value = value


# ---------------------------------------------------------------------------------------- nodes


@dataclass
class ListNode:
    nodes: list[Any] = field(default_factory=list)


@dataclass
class TextNode:
    text: str


@dataclass
class FieldNode:
    value: str


@dataclass
class ParamsEntry:
    value: int = 0
    known: bool = False
    derived: bool = False


@dataclass
class ArrayNode:
    params: tuple[ParamsEntry, ParamsEntry, ParamsEntry]


@dataclass
class FilterNode:
    left: ListNode
    right: ListNode
    operator: str


@dataclass
class IntNode:
    value: int


@dataclass
class FloatNode:
    value: float


@dataclass
class BoolNode:
    value: bool


@dataclass
class WildcardNode:
    pass


@dataclass
class RecursiveNode:
    pass


@dataclass
class UnionNode:
    nodes: list[ListNode]


@dataclass
class IdentifierNode:
    name: str


# --------------------------------------------------------------------------------------- parser

_DICT_KEY = re.compile(r"^'([^']*)'$")
_SLICE = re.compile(r"^(-?\d*)(:-?\d*)?(:-?\d*)?$", re.ASCII)
_FILTER = re.compile(r"^([^!<>=]+)([!<>=]+)(.+?)$", re.S)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _is_terminator(r: str) -> bool:
    return r in (" ", "\t", "\r", "\n", EOF, ".", ",", "[", "]", "$", "@", "{", "}")


def _is_alphanumeric(r: str) -> bool:
    return r == "_" or (r != EOF and (r.isalpha() or unicodedata.category(r) == "Nd"))


def _is_digit(r: str) -> bool:
    return r != EOF and unicodedata.category(r) == "Nd"


class _Parser:
    def __init__(self, text: str) -> None:
        self.input = text
        self.root = ListNode()
        self.pos = 0
        self.start = 0
        self.width = 0

    def parse(self) -> ListNode:
        self._parse_text(self.root)
        return self.root

    def _consume(self) -> str:
        value = self.input[self.start : self.pos]
        self.start = self.pos
        return value

    def _next(self) -> str:
        if self.pos >= len(self.input):
            self.width = 0
            return EOF
        self.width = 1
        self.pos += 1
        return self.input[self.pos - 1]

    def _peek(self) -> str:
        r = self._next()
        self._backup()
        return r

    def _backup(self) -> None:
        self.pos -= self.width

    def _parse_text(self, cur: ListNode) -> None:
        while True:
            if self.input.startswith("{", self.pos):
                if self.pos > self.start:
                    cur.nodes.append(TextNode(self._consume()))
                self._parse_left_delim(cur)
                return
            if self._next() == EOF:
                break
        if self.pos > self.start:
            cur.nodes.append(TextNode(self._consume()))

    def _parse_left_delim(self, cur: ListNode) -> None:
        self.pos += 1
        self._consume()
        node = ListNode()
        cur.nodes.append(node)
        self._parse_inside_action(node)

    def _parse_inside_action(self, cur: ListNode) -> None:
        # Go recurses once per token; a loop here, so that a long path cannot exhaust the stack.
        while True:
            rest = self.input[self.pos :]
            if rest.startswith("}"):
                self.pos += 1
                self._consume()
                self._parse_text(self.root)
                return
            if rest.startswith("[?("):
                self._parse_filter(cur)
                continue
            if rest.startswith(".."):
                self._parse_recursive(cur)
                continue
            r = self._next()
            if r == EOF or r in ("\r", "\n"):
                raise JSONPathError("unclosed action")
            if r == " " or r in ("@", "$"):
                self._consume()
            elif r == "[":
                self._parse_array(cur)
            elif r in ('"', "'"):
                self._parse_quote(cur, r)
            elif r == ".":
                self._parse_field(cur)
            elif r in ("+", "-") or _is_digit(r):
                self._backup()
                self._parse_number(cur)
            elif _is_alphanumeric(r):
                self._backup()
                self._parse_identifier(cur)
            else:
                raise JSONPathError(f"unrecognized character in action: U+{ord(r):04X} {r!r}")

    def _parse_identifier(self, cur: ListNode) -> None:
        while True:
            r = self._next()
            if _is_terminator(r):
                self._backup()
                break
        value = self._consume()
        if value in ("true", "false"):
            cur.nodes.append(BoolNode(value == "true"))
        else:
            cur.nodes.append(IdentifierNode(value))

    def _parse_recursive(self, cur: ListNode) -> None:
        if cur.nodes and isinstance(cur.nodes[-1], RecursiveNode):
            raise JSONPathError("invalid multiple recursive descent")
        self.pos += 2
        self._consume()
        cur.nodes.append(RecursiveNode())
        if _is_alphanumeric(self._peek()):
            self._parse_field(cur)

    def _parse_number(self, cur: ListNode) -> None:
        r = self._peek()
        if r in ("+", "-"):
            self._next()
        while True:
            r = self._next()
            if r != "." and not _is_digit(r):
                self._backup()
                break
        value = self._consume()
        if re.fullmatch(r"[+-]?[0-9]+", value, re.ASCII) and _INT64[0] <= int(value) <= _INT64[1]:
            cur.nodes.append(IntNode(int(value)))
            return
        try:
            if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)", value, re.ASCII):
                raise ValueError(value)
            cur.nodes.append(FloatNode(float(value)))
        except ValueError:
            raise JSONPathError(f"cannot parse number {value}") from None

    def _parse_array(self, cur: ListNode) -> None:
        while True:
            r = self._next()
            if r in (EOF, "\n"):
                raise JSONPathError("unterminated array")
            if r == "]":
                break
        text = self._consume()[1:-1]
        if text == "*":
            text = ":"
        strs = text.split(",")
        if len(strs) > 1:
            union = [_parse_action(f"[{s.strip(' ')}]") for s in strs]
            cur.nodes.append(UnionNode(union))
            return
        m = _DICT_KEY.match(text)
        if m is not None:
            cur.nodes.extend(_parse_action("." + m.group(1)).nodes)
            return
        m = _SLICE.match(text)
        if m is None:
            raise JSONPathError(f"invalid array index {text}")
        values = list(m.groups(""))
        params = (ParamsEntry(), ParamsEntry(), ParamsEntry())
        for i in range(3):
            if values[i] != "":
                if i > 0:
                    values[i] = values[i][1:]
                if i > 0 and values[i] == "":
                    params[i].known = False
                else:
                    params[i].known = True
                    try:
                        params[i].value = int(values[i])
                    except ValueError:
                        raise JSONPathError(f"array index {values[i]} is not a number") from None
            elif i == 1:
                params[i].known = True
                params[i].value = params[0].value + 1
                params[i].derived = True
        cur.nodes.append(ArrayNode(params))

    def _parse_filter(self, cur: ListNode) -> None:
        self.pos += 3
        self._consume()
        begin = end = False
        pair = ""
        while True:
            r = self._next()
            if r in (EOF, "\n"):
                raise JSONPathError("unterminated filter")
            if r in ('"', "'"):
                if not begin:
                    begin = True
                    pair = r
                    continue
                if self.input[self.pos - 2] != "\\" and r == pair:
                    end = True
            elif r == ")" and begin == end:
                break
        if self._next() != "]":
            raise JSONPathError("unclosed array expect ]")
        text = self._consume()[:-2]
        m = _FILTER.match(text)
        if m is None:
            cur.nodes.append(FilterNode(_parse_action(text), ListNode(), "exists"))
        else:
            cur.nodes.append(FilterNode(_parse_action(m.group(1)), _parse_action(m.group(3)), m.group(2)))

    def _parse_quote(self, cur: ListNode, end: str) -> None:
        while True:
            r = self._next()
            if r in (EOF, "\n"):
                raise JSONPathError("unterminated quoted string")
            if r == end and self.input[self.pos - 2] != "\\":
                break
        value = self._consume()
        cur.nodes.append(TextNode(_unquote(value)))

    def _parse_field(self, cur: ListNode) -> None:
        self._consume()
        while self._advance():
            pass
        value = self._consume()
        if value == "*":
            cur.nodes.append(WildcardNode())
        else:
            cur.nodes.append(FieldNode(value.replace("\\", "")))

    def _advance(self) -> bool:
        r = self._next()
        if r == "\\":
            self._next()
        elif _is_terminator(r):
            self._backup()
            return False
        return True


def _parse_action(text: str) -> ListNode:
    root = _Parser("{" + text + "}").parse()
    node = root.nodes[0]
    assert isinstance(node, ListNode)
    return node


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unquote(s: str) -> str:
    """``UnquoteExtend``: Go's ``strconv.Unquote`` for double or single quotes."""
    if len(s) < 2 or s[0] != s[-1] or s[0] not in ('"', "'"):
        raise JSONPathError(f"unquote string {s} error invalid syntax")
    quote, body = s[0], s[1:-1]
    if "\\" not in body and quote not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == quote:
            raise JSONPathError(f"unquote string {s} error invalid syntax")
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise JSONPathError(f"unquote string {s} error invalid syntax")
        e = body[i + 1]
        i += 2
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
        elif e in ("'", '"'):
            if e != quote:
                raise JSONPathError(f"unquote string {s} error invalid syntax")
            out.append(e)
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i : i + n]
            if len(digits) != n or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise JSONPathError(f"unquote string {s} error invalid syntax")
            out.append(chr(int(digits, 16)))
            i += n
        elif e in "01234567":
            digits = body[i - 1 : i + 2]
            if len(digits) != 3 or not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise JSONPathError(f"unquote string {s} error invalid syntax")
            out.append(chr(int(digits, 8)))
            i += 2
        else:
            raise JSONPathError(f"unquote string {s} error invalid syntax")
    return "".join(out)


# ----------------------------------------------------------------------------------- evaluation


class _Missing:
    """Go's invalid ``reflect.Value`` (no value), distinct from JSON null (None)."""


def _check(node: Any) -> None:
    if isinstance(node, (WildcardNode, RecursiveNode, IdentifierNode)):
        raise JSONPathError(f"{type(node).__name__} is not evaluated deterministically by kube")
    if isinstance(node, (ListNode, UnionNode)):
        for n in node.nodes:
            _check(n)
    elif isinstance(node, FilterNode):
        _check(node.left)
        _check(node.right)


class JSONPath:
    """A parsed path with ``AllowMissingKeys(true)``, as the CRD table convertor makes it."""

    def __init__(self, root: ListNode) -> None:
        self.root = root

    @classmethod
    def compile(cls, template: str) -> JSONPath:
        root = _Parser(template).parse()
        _check(root)
        return cls(root)

    def find_results(self, data: Any) -> list[list[Any]]:
        """``FindResults``: one list of values per top-level node; raises ``EvalError``."""
        cur = [data]
        return [_walk(cur, node) for node in self.root.nodes]


def _walk(values: list[Any], node: Any) -> list[Any]:
    if isinstance(node, ListNode):
        return _eval_list(values, node)
    if isinstance(node, TextNode):
        return [node.text]
    if isinstance(node, FieldNode):
        return _eval_field(values, node)
    if isinstance(node, ArrayNode):
        return _eval_array(values, node)
    if isinstance(node, FilterNode):
        return _eval_filter(values, node)
    if isinstance(node, (IntNode, FloatNode, BoolNode)):
        return [node.value] * len(values)
    if isinstance(node, UnionNode):
        out: list[Any] = []
        for n in node.nodes:
            try:
                out.extend(_eval_list(values, n))
            except EvalError as e:
                raise EvalError(str(e), values) from None
        return out
    raise EvalError(f"unexpected Node {node}", values)


def _eval_list(values: list[Any], node: ListNode) -> list[Any]:
    for n in node.nodes:
        values = _walk(values, n)
    return values


def _eval_field(values: list[Any], node: FieldNode) -> list[Any]:
    out = []
    for value in values:
        if isinstance(value, dict) and node.value in value:
            out.append(value[node.value])
    return out  # missing keys allowed


def _go_type(value: Any) -> str:
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return "interface {}"


def _eval_array(values: list[Any], node: ArrayNode) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value is None:
            continue
        if not isinstance(value, list):
            raise EvalError(f"{_go_type(value)} is not array or slice", values)
        p0, p1, p2 = (ParamsEntry(p.value, p.known, p.derived) for p in node.params)
        length = len(value)
        if not p0.known:
            p0.value = 0
        if p0.value < 0:
            p0.value += length
        if not p1.known:
            p1.value = length
        if p1.value < 0 or (p1.value == 0 and p1.derived):
            p1.value += length
        if p1.value == p0.value:
            return out
        if p0.value >= length or p0.value < 0:
            raise EvalError(f"array index out of bounds: index {p0.value}, length {length}", values)
        if p1.value > length or p1.value < 0:
            raise EvalError(f"array index out of bounds: index {p1.value - 1}, length {length}", values)
        if p0.value > p1.value:
            raise EvalError(f"starting index {p0.value} is greater than ending index {p1.value}", values)
        step = 1
        if p2.known:
            if p2.value <= 0:
                raise EvalError("step must be > 0", values)
            step = p2.value
        out.extend(value[p0.value : p1.value : step])
    return out


class _CompareError(Exception):
    pass


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    raise _CompareError("invalid type for comparison")


def _equal(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise _CompareError("incompatible types for comparison")
    return bool(a == b)


def _less(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise _CompareError("incompatible types for comparison")
    if ka == "bool":
        raise _CompareError("invalid type for comparison")
    return bool(a < b)


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "<":
        return _less(a, b)
    if op == ">":
        return not (_less(a, b) or _equal(a, b))
    if op == "==":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    if op == "<=":
        return _less(a, b) or _equal(a, b)
    if op == ">=":
        return not _less(a, b)
    raise _CompareError(f"unrecognized filter operator {op}")


def _eval_filter(values: list[Any], node: FilterNode) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if not isinstance(value, list):
            raise EvalError(f"{value!r} is not array or slice and cannot be filtered", values)
        for item in value:
            temp = [item]
            if node.operator == "exists":
                try:
                    lefts = _eval_list(temp, node.left)
                except EvalError as e:
                    lefts = e.value  # Go looks at what evalList returned, error or not
                if lefts:
                    out.append(item)
                continue
            try:
                lefts = _eval_list(temp, node.left)
            except EvalError as e:
                raise EvalError(str(e), values) from None
            if not lefts:
                continue
            if len(lefts) > 1:
                raise EvalError("can only compare one element at a time", values)
            try:
                rights = _eval_list(temp, node.right)
            except EvalError as e:
                raise EvalError(str(e), values) from None
            if not rights:
                continue
            if len(rights) > 1:
                raise EvalError("can only compare one element at a time", values)
            try:
                passed = _compare(node.operator, lefts[0], rights[0])
            except _CompareError as e:
                raise EvalError(str(e), out) from None
            if passed:
                out.append(item)
    return out

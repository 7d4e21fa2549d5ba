"""A parser of CEL expressions into cel-go's AST shapes, for the ``shardSelector`` of KEP-5866.

kube-apiserver parses a shard selector with cel-go's parser (no macros) and walks the AST; it
never evaluates it (``k8s.io/apiserver/pkg/sharding/parser.go``). What a selector is accepted
as, and the message it is refused with, depend on that AST: which node kind (``unexpected
expression kind 5``), which operator function (``"_&&_"``, ``"!_"``), what a literal's Go type
is (``got int64``). So this module parses the whole CEL expression grammar (``CEL.g4``) to the
same node kinds, operator names and literal values, including cel-go's quirks that change
what is accepted: an even run of ``!`` or ``-`` cancels out, a member call's target
(``x.shardRange(...)``) is not one of its arguments, a leading dot is part of an identifier.

A syntax error's *detail* is the proxy's own wording: cel-go reports ANTLR's recovery messages
(``mismatched input ')' expecting {...}``), reproduced here only for an expression missing
where one is required, the common mistake (a trailing comma, an unclosed call). The prefix
(``Syntax error: ``) and where the error is reported are kube's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from watchcache.selectors.errors import SelectorError


class Kind(IntEnum):
    """cel-go's ``ast.ExprKind``: kube prints a node's kind as this number."""

    UNSPECIFIED = 0
    CALL = 1
    COMPREHENSION = 2
    IDENT = 3
    LIST = 4
    LITERAL = 5
    MAP = 6
    SELECT = 7
    STRUCT = 8


class Null:
    """CEL's ``null`` literal (Go type ``structpb.NullValue``)."""

    def __repr__(self) -> str:
        return "null"


NULL = Null()
LiteralValue = str | bytes | int | float | bool | Null


class Unsigned(int):
    """A ``1u`` literal: Go type ``uint64`` where a plain int literal is ``int64``."""


@dataclass(frozen=True)
class Expr:
    kind: Kind
    # CALL: function name; IDENT: the identifier; SELECT: the field name.
    name: str = ""
    args: tuple[Expr, ...] = ()
    # CALL: the receiver of a member call; SELECT: the operand.
    target: Expr | None = None
    value: LiteralValue | None = field(default=None, compare=False)


class CelSyntaxError(SelectorError):
    """The expression is not CEL; ``str(err)`` is what cel-go's first error message would say."""


# An expression can start with one of these (ANTLR's expected set where an expression is required).
_STARTS = ("'['", "'{'", "'('", "'.'", "'-'", "'!'", "'true'", "'false'", "'null'")
_TOKENS = ("NUM_FLOAT", "NUM_INT", "NUM_UINT", "STRING", "BYTES", "IDENTIFIER")
_EXPR_START = ", ".join(_STARTS + _TOKENS)
_EXPR_OR_CLOSE = ", ".join((*_STARTS[:3], "')'", *_STARTS[3:], *_TOKENS))
# cel-go's default parser limit (``parser.MaxRecursionDepth``).
MAX_RECURSION_DEPTH = 250
_RESERVED = frozenset(
    ("as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop", "package",
     "namespace", "return", "var", "void", "while")
)  # fmt: skip
_RELATIONS = {"<": "_<_", "<=": "_<=_", ">=": "_>=_", ">": "_>_", "==": "_==_", "!=": "_!=_", "in": "@in"}
_ADDITIVE = {"+": "_+_", "-": "_-_"}
_MULTIPLICATIVE = {"*": "_*_", "/": "_/_", "%": "_%_"}
_PUNCT = ("||", "&&", "<=", ">=", "==", "!=", "<", ">", "+", "-", "*", "/", "%", "!", "?", ":", ".", ",")
_BRACKETS = "()[]{}"
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?",
}  # fmt: skip


@dataclass(frozen=True)
class _Token:
    type: str  # "punct", "ident", "int", "uint", "float", "string", "bytes", "eof"
    text: str
    value: LiteralValue | None = None


def _token_error(text: str) -> CelSyntaxError:
    return CelSyntaxError(f"Syntax error: token recognition error at: '{text}'")


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def tokens(self) -> list[_Token]:
        out = []
        while True:
            tok = self._next()
            out.append(tok)
            if tok.type == "eof":
                return out

    def _next(self) -> _Token:
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n\f":
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                break
        if self.pos >= n:
            return _Token("eof", "<EOF>")
        start = self.pos
        ch = text[start]
        if ch.isascii() and (ch.isalpha() or ch == "_"):
            end = start + 1
            while end < n and text[end].isascii() and (text[end].isalnum() or text[end] == "_"):
                end += 1
            word = text[start:end]
            if end < n and text[end] in "'\"" and word.lower() in ("r", "b", "rb", "br"):
                return self._string(word.lower())
            self.pos = end
            return _Token("ident", word)
        if ch in "'\"":
            return self._string("")
        if ch.isdigit() or (ch == "." and start + 1 < n and text[start + 1].isdigit()):
            return self._number()
        for p in _PUNCT:
            if text.startswith(p, start):
                self.pos = start + len(p)
                return _Token("punct", p)
        if ch in _BRACKETS:
            self.pos = start + 1
            return _Token("punct", ch)
        raise _token_error(ch)

    def _number(self) -> _Token:
        text, n, start = self.text, len(self.text), self.pos
        if text.startswith(("0x", "0X"), start):
            end = start + 2
            while end < n and text[end] in "0123456789abcdefABCDEF":
                end += 1
            if end == start + 2:
                raise _token_error(text[start : start + 2])
            value = int(text[start + 2 : end], 16)
        else:
            end = start
            while end < n and text[end].isdigit():
                end += 1
            is_float = False
            if end < n and text[end] == "." and end + 1 < n and text[end + 1].isdigit():
                is_float = True
                end += 1
                while end < n and text[end].isdigit():
                    end += 1
            if end < n and text[end] in "eE":
                exp = end + 1
                if exp < n and text[exp] in "+-":
                    exp += 1
                if exp < n and text[exp].isdigit():
                    is_float = True
                    end = exp
                    while end < n and text[end].isdigit():
                        end += 1
            if is_float:
                self.pos = end
                raw = text[start:end]
                return _Token("float", raw, float(raw))
            value = int(text[start:end], 10)
        if end < n and text[end] in "uU":
            self.pos = end + 1
            return _Token("uint", text[start : end + 1], Unsigned(value))
        self.pos = end
        return _Token("int", text[start:end], value)

    def _string(self, prefix: str) -> _Token:
        text, n = self.text, len(self.text)
        start = self.pos
        self.pos += len(prefix)
        quote = text[self.pos]
        triple = text.startswith(quote * 3, self.pos)
        delim = quote * 3 if triple else quote
        self.pos += len(delim)
        raw = "r" in prefix
        out: list[str] = []
        while True:
            if self.pos >= n:
                raise _token_error(text[start:])
            if text.startswith(delim, self.pos):
                self.pos += len(delim)
                break
            ch = text[self.pos]
            if ch in "\r\n" and not triple:
                raise _token_error(text[start : self.pos])
            if ch == "\\" and not raw:
                out.append(self._escape(start))
                continue
            if ch == "\\" and raw and self.pos + 1 < n:
                out.append(text[self.pos : self.pos + 2])
                self.pos += 2
                continue
            out.append(ch)
            self.pos += 1
        value = "".join(out)
        if "b" in prefix:
            return _Token("bytes", text[start : self.pos], value.encode("utf-8", "surrogatepass"))
        return _Token("string", text[start : self.pos], value)

    def _escape(self, start: int) -> str:
        text, pos = self.text, self.pos
        nxt = text[pos + 1 : pos + 2]
        if nxt in _SIMPLE_ESCAPES:
            self.pos = pos + 2
            return _SIMPLE_ESCAPES[nxt]
        width = {"x": 2, "X": 2, "u": 4, "U": 8}.get(nxt)
        if width is not None:
            digits = text[pos + 2 : pos + 2 + width]
            if len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                self.pos = pos + 2 + width
                return chr(int(digits, 16)) if int(digits, 16) <= 0x10FFFF else ""
        elif nxt in "0123":
            digits = text[pos + 1 : pos + 4]
            if len(digits) == 3 and all(c in "01234567" for c in digits):
                self.pos = pos + 4
                return chr(int(digits, 8))
        raise _token_error(text[start : pos + 2])


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def _is(self, text: str) -> bool:
        tok = self.tokens[self.i]
        return tok.type == "punct" and tok.text == text

    def _take(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.type != "eof":
            self.i += 1
        return tok

    def _expect(self, text: str) -> None:
        if not self._is(text):
            raise self._mismatch(f"'{text}'")
        self.i += 1

    def _mismatch(self, expecting: str) -> CelSyntaxError:
        return CelSyntaxError(f"Syntax error: mismatched input '{self.tok.text}' expecting {expecting}")

    def parse(self) -> Expr:
        expr = self.expr()
        if self.tok.type != "eof":
            raise CelSyntaxError(f"Syntax error: extraneous input '{self.tok.text}' expecting <EOF>")
        return expr

    def expr(self) -> Expr:
        self.depth += 1
        if self.depth > MAX_RECURSION_DEPTH:
            raise CelSyntaxError(f"expression recursion limit exceeded: {MAX_RECURSION_DEPTH}")
        try:
            cond = self._binary_chain("||", "_||_", self._and)
            if not self._is("?"):
                return cond
            self.i += 1
            then = self._binary_chain("||", "_||_", self._and)
            self._expect(":")
            other = self.expr()
            return Expr(Kind.CALL, "_?_:_", (cond, then, other))
        finally:
            self.depth -= 1

    def _binary_chain(self, op: str, fn: str, operand: Callable[[], Expr]) -> Expr:
        # cel-go balances a chain of one logical operator; the walk in shards.py is in order,
        # which a left fold keeps just as well.
        left = operand()
        while self._is(op):
            self.i += 1
            left = Expr(Kind.CALL, fn, (left, operand()))
        return left

    def _and(self) -> Expr:
        return self._binary_chain("&&", "_&&_", self._relation)

    def _relation(self) -> Expr:
        left = self._calc(0)
        while (self.tok.type == "punct" or self.tok.text == "in") and self.tok.text in _RELATIONS:
            fn = _RELATIONS[self._take().text]
            left = Expr(Kind.CALL, fn, (left, self._calc(0)))
        return left

    def _calc(self, level: int) -> Expr:
        ops = _ADDITIVE if level == 0 else _MULTIPLICATIVE
        left = self._calc(1) if level == 0 else self._unary()
        while self.tok.type == "punct" and self.tok.text in ops:
            fn = ops[self._take().text]
            left = Expr(Kind.CALL, fn, (left, self._calc(1) if level == 0 else self._unary()))
        return left

    def _unary(self) -> Expr:
        for op, fn in (("!", "!_"), ("-", "-_")):
            if self._is(op):
                count = 0
                while self._is(op):
                    self.i += 1
                    count += 1
                if op == "-" and self.tok.type in ("int", "float") and count == 1:
                    lit = self._take()
                    return self._member(Expr(Kind.LITERAL, value=-lit.value))  # type: ignore[operator]
                member = self._member(self._primary())
                # cel-go: an even number of the same unary operator is the operand itself.
                return member if count % 2 == 0 else Expr(Kind.CALL, fn, (member,))
        return self._member(self._primary())

    def _member(self, expr: Expr) -> Expr:
        while True:
            if self._is("."):
                self.i += 1
                if self.tok.type != "ident":
                    raise self._mismatch("IDENTIFIER")
                name = self._take().text
                if self._is("("):
                    expr = Expr(Kind.CALL, name, self._args(), target=expr)
                else:
                    expr = Expr(Kind.SELECT, name, target=expr)
            elif self._is("["):
                self.i += 1
                index = self._required_expr()
                self._expect("]")
                expr = Expr(Kind.CALL, "_[_]", (expr, index))
            else:
                return expr

    def _args(self) -> tuple[Expr, ...]:
        self._expect("(")
        if self._is(")"):
            self.i += 1
            return ()
        args = [self._required_expr(_EXPR_OR_CLOSE)]
        while self._is(","):
            self.i += 1
            args.append(self._required_expr())
        self._expect(")")
        return tuple(args)

    def _required_expr(self, expecting: str = _EXPR_START) -> Expr:
        tok = self.tok
        starts = tok.type not in ("eof", "punct") or tok.text in ("[", "{", "(", ".", "-", "!")
        if not starts or (tok.type == "ident" and tok.text == "in"):
            raise self._mismatch("{" + expecting + "}")
        return self.expr()

    def _primary(self) -> Expr:
        tok = self.tok
        if tok.type == "punct" and tok.text == "(":
            self.i += 1
            inner = self._required_expr()
            self._expect(")")
            return inner
        if tok.type == "punct" and tok.text == "[":
            self.i += 1
            return Expr(Kind.LIST, args=self._elements("]"))
        if tok.type == "punct" and tok.text == "{":
            self.i += 1
            return Expr(Kind.MAP, args=self._entries())
        if tok.type in ("int", "uint", "float", "string", "bytes"):
            self.i += 1
            return Expr(Kind.LITERAL, value=tok.value)
        if tok.type == "ident" and tok.text in ("true", "false", "null"):
            self.i += 1
            return Expr(Kind.LITERAL, value={"true": True, "false": False}.get(tok.text, NULL))
        dot = ""
        if tok.type == "punct" and tok.text == ".":
            self.i += 1
            dot = "."
        if self.tok.type != "ident" or self.tok.text == "in":
            raise self._mismatch("{" + _EXPR_START + "}")
        name = dot + self._take().text
        if self._is("("):
            return Expr(Kind.CALL, name, self._args())
        if name.lstrip(".") in _RESERVED:
            raise CelSyntaxError(f"reserved identifier: {name.lstrip('.')}")
        if self._is("{"):
            self.i += 1
            return Expr(Kind.STRUCT, name, self._entries(fields=True))
        return Expr(Kind.IDENT, name)

    def _elements(self, close: str) -> tuple[Expr, ...]:
        items: list[Expr] = []
        while not self._is(close):
            items.append(self._required_expr())
            if not self._is(","):
                break
            self.i += 1
        self._expect(close)
        return tuple(items)

    def _entries(self, *, fields: bool = False) -> tuple[Expr, ...]:
        items: list[Expr] = []
        while not self._is("}"):
            if fields:
                if self.tok.type != "ident":
                    raise self._mismatch("IDENTIFIER")
                self.i += 1
            else:
                items.append(self._required_expr())
            self._expect(":")
            items.append(self._required_expr())
            if not self._is(","):
                break
            self.i += 1
        self._expect("}")
        return tuple(items)


def parse(text: str) -> Expr:
    """The AST cel-go's parser (no macros) makes of ``text``; CelSyntaxError if it makes none."""
    parser = _Parser(_Lexer(text).tokens())
    try:
        return parser.parse()
    except RecursionError:
        raise CelSyntaxError(f"expression recursion limit exceeded: {MAX_RECURSION_DEPTH}") from None

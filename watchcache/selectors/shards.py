"""``shardSelector`` (KEP-5866, kube v1.36 alpha ``ShardedListAndWatch``): hash ranges over one field.

``shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')`` selects the
objects whose 64-bit FNV-1a hash of the field's string falls in ``[start, end)``; ``||`` joins
ranges of the same field. N replicas of a controller each pass one of N disjoint ranges that
cover ``[0, 2^64)`` and together see every object exactly once.

Syntax, validation order and messages are kube's (``k8s.io/apiserver/pkg/sharding/parser.go``;
hash and matching ``k8s.io/apimachinery/pkg/sharding``): bounds are ``'0x'`` + exactly 16
lowercase hex digits, or ``'0x10000000000000000'`` (2^64) as an exclusive end. The only fields
are ``object.metadata.uid`` and ``object.metadata.namespace``, both immutable: an object
never moves between shards, so a watch never sees one leave or join its shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchcache.quoting import go_quote
from watchcache.selectors import cel
from watchcache.selectors.errors import SelectorError

UID = "object.metadata.uid"
NAMESPACE = "object.metadata.namespace"
FIELDS = (UID, NAMESPACE)
HASH_SPACE = 1 << 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = HASH_SPACE - 1
_HEX_DIGITS = frozenset("0123456789abcdef")
_GO_TYPES = {str: "string", bytes: "[]uint8", int: "int64", cel.Unsigned: "uint64", float: "float64", bool: "bool"}


def fnv1a_64(value: str) -> int:
    """Go's ``hash/fnv`` New64a over the string's UTF-8 bytes (kube's ``sharding.HashField``).

    ~25 µs for a 36-byte uid in CPython on a loaded machine: callers memoize per object
    (``cache/shardhash.py``)."""
    h = _FNV_OFFSET
    for byte in value.encode("utf-8", "surrogatepass"):
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


class ShardSelectorError(SelectorError):
    """A shardSelector kube refuses; ``str(err)`` is kube's message after ``invalid shard selector: ``."""


@dataclass(frozen=True)
class ShardRange:
    """``[start, end)`` of the hash space, with the bounds as the client wrote them (echoed in shardInfo)."""

    field: str
    start: str
    end: str

    @property
    def lo(self) -> int:
        return int(self.start, 16)

    @property
    def hi(self) -> int:
        return int(self.end, 16)


class ShardSelector:
    """One or more ranges over one field; an object matches if its hash is in any of them."""

    __slots__ = ("bounds", "field", "ranges", "text")

    def __init__(self, ranges: tuple[ShardRange, ...]) -> None:
        if not ranges or any(r.field != ranges[0].field for r in ranges):
            raise ValueError("a shard selector has one or more ranges over one field")
        self.ranges = ranges
        self.field = ranges[0].field
        self.bounds = tuple((r.lo, r.hi) for r in ranges)
        # kube's ``Selector.String()``: what ListMeta.shardInfo.selector echoes back.
        self.text = " || ".join(f"shardRange({r.field}, '{r.start}', '{r.end}')" for r in ranges)

    def __repr__(self) -> str:
        return f"ShardSelector({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardSelector) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def contains(self, value_hash: int) -> bool:
        """Whether a field whose FNV-1a hash is ``value_hash`` is in this selector's ranges."""
        for lo, hi in self.bounds:  # noqa: SIM110 - a loop is ~2x faster than any() over a generator
            if lo <= value_hash < hi:
                return True
        return False

    def matches_value(self, value: str) -> bool:
        return self.contains(fnv1a_64(value))


def parse_shard_selector(text: str) -> ShardSelector:
    """kube's ``sharding.Parse``. Raises ShardSelectorError with kube's message.

    The caller treats an absent or empty query parameter as no selector (kube's ``!= ""``);
    one of only whitespace reaches here and is refused, as kube refuses it.
    """
    text = text.strip()  # Go's strings.TrimSpace: Unicode white space, as str.strip
    if not text:
        raise ShardSelectorError("empty shard selector is not allowed; omit the parameter for unfiltered lists")
    try:
        expr = cel.parse(text)
    except cel.CelSyntaxError as e:
        raise ShardSelectorError(f"CEL parse error: {e}") from None
    ranges = _walk(expr)
    for r in ranges[1:]:
        if r.field != ranges[0].field:
            raise ShardSelectorError(
                f"all shard ranges must use the same field, got {go_quote(ranges[0].field)} and {go_quote(r.field)}"
            )
    return ShardSelector(tuple(ranges))


def _walk(expr: cel.Expr) -> list[ShardRange]:
    # In order, the first error wins: kube's walkExpr.
    if expr.kind is cel.Kind.CALL:
        if expr.name == "_||_":
            return _walk(expr.args[0]) + _walk(expr.args[1])
        if expr.name == "shardRange":
            return [_shard_range(expr)]
        raise ShardSelectorError(f"unsupported function {go_quote(expr.name)}; only shardRange() and || are allowed")
    raise ShardSelectorError(f"unexpected expression kind {int(expr.kind)}; expected shardRange() call or || operator")


def _shard_range(call: cel.Expr) -> ShardRange:
    args = call.args  # a member call's target (x.shardRange(...)) is not an argument: kube ignores it
    if len(args) != 3:
        raise ShardSelectorError(f"shardRange() requires exactly 3 arguments, got {len(args)}")
    path = _field_path(args[0])
    if path not in FIELDS:
        raise ShardSelectorError(f"unsupported field path {go_quote(path)}; supported: {UID}, {NAMESPACE}")
    start = _hex_literal(args[1], "hexStart")
    end = _hex_literal(args[2], "hexEnd")
    if not _hex_less(start, end):
        raise ShardSelectorError(f"shard range start {start} must be less than end {end}")
    return ShardRange(path, start, end)


def _field_path(expr: cel.Expr) -> str:
    if expr.kind is cel.Kind.IDENT:
        return expr.name
    if expr.kind is cel.Kind.SELECT and expr.target is not None:
        return _field_path(expr.target) + "." + expr.name
    raise ShardSelectorError(
        "shardRange() first argument: expected field path (e.g. object.metadata.uid), "
        f"got expression kind {int(expr.kind)}"
    )


def _hex_literal(expr: cel.Expr, name: str) -> str:
    if expr.kind is not cel.Kind.LITERAL:
        raise ShardSelectorError(f"{name} must be a string literal (e.g. '0xff'), got expression kind {int(expr.kind)}")
    value = expr.value
    if not isinstance(value, str):
        go_type = "structpb.NullValue" if value is cel.NULL else _GO_TYPES.get(type(value), type(value).__name__)
        raise ShardSelectorError(f"{name} must be a string literal, got {go_type}")
    if not value.startswith("0x"):
        raise ShardSelectorError(f"{name} must have '0x' prefix, got {go_quote(value)}")
    digits = value[2:]
    if not digits:
        raise ShardSelectorError(f"{name}: hex value is required after '0x'")
    size = len(digits.encode("utf-8", "surrogatepass"))  # Go's len: bytes
    if size > 17:
        raise ShardSelectorError(f"{name}: hex value too long ({size} chars, max 17): {go_quote(digits)}")
    for ch in digits:
        if ch not in _HEX_DIGITS:
            raise ShardSelectorError(f"{name}: invalid hex character {go_quote(ch)} in {go_quote(value)}")
    if size == 17:
        if value != "0x10000000000000000":
            raise ShardSelectorError(
                f"{name}: 17-digit hex value must be '0x10000000000000000' (2^64), got {go_quote(value)}"
            )
    elif size != 16:
        padded = "0x" + "0" * (16 - size) + digits
        raise ShardSelectorError(
            f"{name} must be a 0x-prefixed 16-digit hex value, got {go_quote(value)} (did you mean {go_quote(padded)}?)"
        )
    return value


def _hex_less(a: str, b: str) -> bool:
    """kube's ``HexLess`` over normalized bounds: a longer one (2^64) is larger."""
    return len(a) < len(b) if len(a) != len(b) else a < b

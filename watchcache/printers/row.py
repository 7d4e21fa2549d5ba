"""A Table row, derived once per object, with holes for what depends on the request's clock.

kube prints a row per object at each request; most of its cells (name, status, IPs,
images...) depend only on the object, and a few on the time of the request ("5m" old, "3 (2m
ago)" since the last restart, a CRD's ``date`` column). So a row is derived once, when a
Table first asks for the object, into JSON pieces and the timestamps between them
(``Row``), and kept on the ``CachedObject`` (``row_of``), as ``cache/metadata.py`` keeps
the PartialObjectMetadata. A request then writes ``pieces[0], age(stamps[0]), pieces[1],
...``: no parse, no encoding, one ``human_duration`` per hole (memoized per request, since
objects made in the same second share it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from watchcache.cache.metadata import derive_metadata_json
from watchcache.cache.object import CachedObject
from watchcache.printers.duration import human_duration
from watchcache.printers.gofmt import go_json_float, json_string
from watchcache.quoting import go_json_escape
from watchcache.resources import ResourceType


class Unprintable(Exception):
    """kube's printer would fail on this object (its Table request fails): the proxy passes it through."""


@dataclass(frozen=True)
class Column:
    """A ``metav1.TableColumnDefinition``."""

    name: str
    type: str
    description: str
    format: str = ""
    priority: int = 0

    def json(self) -> str:
        return (
            f'{{"name":{json_string(self.name)},"type":{json_string(self.type)},"format":{json_string(self.format)},'
            f'"description":{json_string(self.description)},"priority":{self.priority}}}'
        )


def columns_json(columns: Sequence[Column]) -> bytes:
    return ("[" + ",".join(c.json() for c in columns) + "]").encode()


@dataclass(frozen=True, slots=True)
class Since:
    """A cell ``prefix + HumanDuration(now - at) + suffix``; ``at`` in ns since the epoch."""

    at: int
    prefix: str = ""
    suffix: str = ""


Cell = str | int | float | bool | None | Since


def _cell_json(cell: Cell) -> str:
    if cell is None:
        return "null"
    if cell is True:
        return "true"
    if cell is False:
        return "false"
    if isinstance(cell, str):
        return json_string(cell)
    if isinstance(cell, int):
        return str(cell)
    if isinstance(cell, float):
        return go_json_float(cell)
    raise TypeError(f"not a cell: {cell!r}")


class Row:
    """A row's JSON up to its object: ``{"cells":[...]`` and, if any, ``,"conditions":[...]``.

    ``pieces`` has one more element than ``stamps``; the JSON is the pieces with
    ``human_duration(now - stamp)`` between them.
    """

    __slots__ = ("pieces", "stamps")

    def __init__(self, pieces: tuple[bytes, ...], stamps: tuple[int, ...]) -> None:
        self.pieces = pieces
        self.stamps = stamps

    def __repr__(self) -> str:
        return f"Row({self.render(0)!r})"

    def render(self, now: int) -> bytes:
        """The row's JSON at ``now`` (tests, cold paths)."""
        out: list[bytes] = []
        self.write(out, now, {})
        return b"".join(out)

    def write(self, out: list[bytes], now: int, memo: dict[int, bytes]) -> None:
        pieces = self.pieces
        out.append(pieces[0])
        i = 1
        for at in self.stamps:
            age = memo.get(at)
            if age is None:
                age = memo[at] = human_duration(now - at).encode()
            out.append(age)
            out.append(pieces[i])
            i += 1


def _static_json(run: list[Cell]) -> bytes:
    """A run of cells without holes, comma-separated, as Go's ``encoding/json`` writes them.

    orjson writes JSON as Go does but for three things: Go escapes ``<``, ``>``, ``&``, U+2028 and
    U+2029 (which can only occur inside strings, so a byte replace is exact), and writes a float
    with no fraction as ``1``, not ``1.0`` (floats take the slow path).
    """
    if any(type(c) is float for c in run):
        return ",".join(_cell_json(c) for c in run).encode()
    try:
        out = orjson.dumps(run)[1:-1]
    except orjson.JSONEncodeError:  # an integer beyond 64 bits (a custom resource's)
        return ",".join(_cell_json(c) for c in run).encode()
    return go_json_escape(out)


def build_row(cells: Sequence[Cell], conditions: Sequence[Mapping[str, str]] = ()) -> Row:
    pieces: list[bytes] = []
    stamps: list[int] = []
    text = b'{"cells":['
    run: list[Cell] = []
    first = True
    for cell in cells:
        if isinstance(cell, Since):
            if run:
                text += (b"" if first else b",") + _static_json(run)
                first = False
                run = []
            text += (b"" if first else b",") + json_string(cell.prefix)[:-1].encode()
            pieces.append(text)
            stamps.append(cell.at)
            text = json_string(cell.suffix)[1:].encode()
            first = False
        else:
            run.append(cell)
    if run:
        text += (b"" if first else b",") + _static_json(run)
    text += b"]"
    if conditions:
        text += b',"conditions":['
        text += ",".join(
            "{"
            + ",".join(f"{json_string(k)}:{json_string(v)}" for k, v in c.items() if v or k in ("type", "status"))
            + "}"
            for c in conditions
        ).encode()
        text += b"]"
    pieces.append(text)
    return Row(tuple(pieces), tuple(stamps))


class Printer(Protocol):
    """kube's TableConvertor for one resource: its columns, and the row of an object."""

    @property
    def columns(self) -> Sequence[Column]: ...

    @property
    def null_when_empty(self) -> bool:
        """An empty list's ``rows`` is ``null`` (kube's default convertor), not ``[]``."""

    def row(self, obj: dict[str, Any]) -> Row:
        """The row of ``obj`` (decoded JSON, without kind and apiVersion); raises ``Unprintable``."""


@dataclass(frozen=True, eq=False)
class FunctionPrinter:
    """A built-in kind's printer: its columns and a function of the object to cells (and conditions)."""

    name: str
    columns: Sequence[Column]
    cells: Callable[[dict[str, Any]], tuple[list[Cell], list[dict[str, str]]]]
    null_when_empty: bool = False

    def __repr__(self) -> str:
        return f"Printer({self.name})"

    def row(self, obj: dict[str, Any]) -> Row:
        try:
            cells, conditions = self.cells(obj)
        except Unprintable:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            # A value of a type kube's decoder would have refused: not kube's Table, whatever we print.
            raise Unprintable(f"{self.name}: {e}") from e
        return build_row(cells, conditions)


def row_of(printer: Printer, obj: CachedObject, resource: ResourceType) -> Row:
    """``obj``'s row for ``printer``: derived on first use, then kept on the object.

    The one parse also derives the object's PartialObjectMetadata (the rows' object by default),
    if nothing has yet: a Table's first read of an object costs one ``orjson.loads``, not two.
    """
    derived = obj.table_row
    if derived is not None and derived[0] is printer:
        return derived[1]
    decoded = orjson.loads(b"{" + obj.body)
    row = printer.row(decoded)
    if obj.meta_json is None:
        derive_metadata_json(obj, resource, decoded)
    obj.table_row = (printer, row)
    return row

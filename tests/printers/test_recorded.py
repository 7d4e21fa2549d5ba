"""The printers against kube-apiserver's own Tables, recorded once (``capture.py``): no kit needed.

Each fixture holds kube's Table of a LIST with ``includeObject=Object`` (the rows carry the objects
as kube served them: the printers' input), the same snapshot with ``None`` and ``Metadata``, a GET
and a ``v1beta1`` Table, each with the wall-clock bounds of the request. The cache is fed the
objects, and each Table is written by ``TableEncoding`` with the clock at either bound: every cell
must be kube's at one of them (ages are printed at a moment in between), column definitions,
conditions, row objects and list metadata equal. The watches check one-row Tables per event, the
columns in the first event only, and the initial-events-end bookmark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.doubles import NullSink
from watchcache.cache.encoding import FULL_JSON
from watchcache.cache.object import CachedObject, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.printers.crd import CustomPrinter
from watchcache.printers.kube import builtin_printer
from watchcache.printers.row import Printer
from watchcache.printers.table import TableEncoding
from watchcache.resources import ResourceType
from watchcache.watchers.watcher import Watcher

FIXTURES = Path(__file__).parent / "fixtures"
KINDS = sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem != "watch")


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def resource_of(target: dict[str, Any]) -> ResourceType:
    return ResourceType(target["group"], target["version"], target["resource"], target["kind"], target["namespaced"])


def printer_for(resource: ResourceType) -> Printer:
    printer = builtin_printer(resource.group, resource.resource)
    if printer is not None:
        return printer
    for row in load("customresourcedefinitions")["lists"]["Object"]["body"]["rows"]:
        crd = row["object"]
        if crd["metadata"]["name"] == f"{resource.resource}.{resource.group}":
            return CustomPrinter.from_crd(crd, resource.version)
    raise AssertionError(f"no printer for {resource}")


def cached(resource: ResourceType, rows: list[dict[str, Any]] | None) -> list[CachedObject]:
    return [encode_object(resource, json.loads(json.dumps(row["object"]))) for row in rows or []]


def rendered(parts: list[bytes] | tuple[bytes, ...]) -> Any:
    return orjson.loads(b"".join(parts))


def assert_same_table(kube: dict[str, Any], early: dict[str, Any], late: dict[str, Any], where: str) -> None:
    """``early``/``late``: ours with the clock at the request's two bounds."""
    for key in ("kind", "apiVersion", "columnDefinitions"):
        assert early[key] == kube[key], f"{where}: {key}"
    assert {k: v for k, v in early["metadata"].items() if k != "continue"} == {
        k: v for k, v in kube["metadata"].items() if k != "continue"
    }, where
    if kube["rows"] is None:
        assert early["rows"] is None, where
        return
    assert len(early["rows"]) == len(kube["rows"]), where
    for theirs, ours_early, ours_late in zip(kube["rows"], early["rows"], late["rows"], strict=True):
        name = theirs["cells"][0]
        assert len(ours_early["cells"]) == len(theirs["cells"]), f"{where} {name}"
        for i, cell in enumerate(theirs["cells"]):
            column = kube["columnDefinitions"][i]["name"] if kube["columnDefinitions"] else i
            assert cell in (ours_early["cells"][i], ours_late["cells"][i]), (
                f"{where} {name} column {column}: kube {cell!r}, ours {ours_early['cells'][i]!r}"
            )
            assert type(cell) is type(ours_early["cells"][i]), f"{where} {name} column {column}: JSON type"
        assert ours_early.get("conditions") == theirs.get("conditions"), f"{where} {name}: conditions"
        assert ours_early["object"] == theirs["object"], f"{where} {name}: row object"


def render(
    encoding_of: Any, resource: ResourceType, objects: list[CachedObject], record: dict[str, Any], **kw: Any
) -> tuple[Any, Any]:
    out = []
    for at in (record["sent"], record["received"]):
        encoding = encoding_of(lambda at=at: at)
        out.append(rendered(encoding.list_parts(resource, objects, **kw)))
    return out[0], out[1]


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("include", ["Object", "None", "Metadata"])
def test_list_tables_are_kubes(name: str, include: str) -> None:
    record = load(name)
    resource = resource_of(record["target"])
    printer = printer_for(resource)
    objects = cached(resource, record["lists"]["Object"]["body"]["rows"])
    kube = record["lists"][include]
    rv = int(kube["body"]["metadata"]["resourceVersion"])
    early, late = render(
        lambda clock: TableEncoding(printer, "v1", include, clock), resource, objects, kube,
        rv=rv, continue_token=None, remaining=None,
    )  # fmt: skip
    assert_same_table(kube["body"], early, late, f"{name} includeObject={include}")


@pytest.mark.parametrize("name", KINDS)
def test_get_and_v1beta1_tables_are_kubes(name: str) -> None:
    record = load(name)
    resource = resource_of(record["target"])
    printer = printer_for(resource)
    objects = cached(resource, record["lists"]["Object"]["body"]["rows"])
    beta = record["v1beta1"]
    rv = int(beta["body"]["metadata"]["resourceVersion"])
    early, late = render(
        lambda clock: TableEncoding(printer, "v1beta1", "Metadata", clock), resource, objects, beta,
        rv=rv, continue_token=None, remaining=None,
    )  # fmt: skip
    assert_same_table(beta["body"], early, late, f"{name} v1beta1")
    if "get" in record:
        get = record["get"]
        obj = objects[0]
        tables = [
            rendered(TableEncoding(printer, "v1", "Metadata", lambda at=at: at).object_parts(resource, obj))
            for at in (get["sent"], get["received"])
        ]
        assert_same_table(get["body"], tables[0], tables[1], f"{name} GET")


# ------------------------------------------------------------------------------------- watches

CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True)


def frames_of(watcher: Watcher) -> list[dict[str, Any]]:
    data = b"".join(watcher.take()[0])
    return [json.loads(line) for line in data.splitlines()]


def assert_same_frames(kube: list[dict[str, Any]], ours: list[dict[str, Any]], where: str) -> None:
    assert [f["type"] for f in ours] == [f["event"]["type"] for f in kube], where
    for i, (theirs, mine) in enumerate(zip((f["event"] for f in kube), ours, strict=True)):
        table, got = theirs["object"], mine["object"]
        assert got["columnDefinitions"] == table["columnDefinitions"], f"{where} frame {i}: columns"
        assert got["metadata"] == table["metadata"], f"{where} frame {i}"
        assert {k: v for k, v in got.items() if k != "rows"} == {k: v for k, v in table.items() if k != "rows"}
        for theirs_row, my_row in zip(table["rows"], got["rows"], strict=True):
            assert my_row["object"] == theirs_row["object"], f"{where} frame {i}: row object"
            assert my_row["cells"][:-1] == theirs_row["cells"][:-1], f"{where} frame {i}"
            assert same_age(my_row["cells"][-1], theirs_row["cells"][-1]), f"{where} frame {i}: age"


def same_age(a: str, b: str) -> bool:
    """Ages printed a moment apart: equal, or whole seconds one apart."""
    if a == b:
        return True
    if a.endswith("s") and b.endswith("s") and a[:-1].isdigit() and b[:-1].isdigit():
        return abs(int(a[:-1]) - int(b[:-1])) <= 1
    return False


@pytest.mark.parametrize("include", ["Object", "None"])
def test_watch_events_are_one_row_tables_with_the_columns_first(include: str) -> None:
    recorded = load("watch")
    kube = recorded["watches"][include]["frames"]
    objects = [f["event"]["object"]["rows"][0]["object"] for f in recorded["watches"]["Object"]["frames"]]
    times = iter([f["at"] for f in kube])
    cacher = Cacher(CONFIGMAPS, CacheConfig(), clock=lambda: 0.0)
    start = int(recorded["start_rv"])
    cacher.replace([], start)
    encoding = TableEncoding(printer_for(CONFIGMAPS), "v1", include, lambda: next(times))
    watcher = Watcher(
        CONFIGMAPS, SelectionPredicate.parse(CONFIGMAPS, "i23-tables", "", ""), start, NullSink(), encoding=encoding
    )
    cacher.add_watcher(watcher)
    for frame, obj in zip(recorded["watches"]["Object"]["frames"], objects, strict=True):
        kind = frame["event"]["type"]
        encoded = encode_object(CONFIGMAPS, json.loads(json.dumps(obj)))
        cacher.apply([("DELETED" if kind == "DELETED" else "ADDED", encoded)])
    assert_same_frames(kube, frames_of(watcher), f"watch includeObject={include}")


def test_initial_events_and_their_bookmark_as_tables() -> None:
    recorded = load("watch")["initial"]
    kube = recorded["frames"]
    listed = recorded["objects"]["body"]
    cacher = Cacher(CONFIGMAPS, CacheConfig(), clock=lambda: 0.0)
    rv = int(listed["metadata"]["resourceVersion"])
    cacher.replace([encode_object(CONFIGMAPS, row["object"]) for row in listed["rows"]], rv)
    times = iter([f["at"] for f in kube])
    encoding = TableEncoding(printer_for(CONFIGMAPS), "v1", "Metadata", lambda: next(times))
    watcher = Watcher(
        CONFIGMAPS,
        SelectionPredicate.parse(CONFIGMAPS, "i23-tables", "", ""),
        rv,
        NullSink(),
        encoding=encoding,
        allow_bookmarks=True,
    )
    parts = [p for obj in cacher.cache.snapshot().iter_range("", None) for p in encoding.initial_parts(CONFIGMAPS, obj)]
    watcher.deliver_initial(parts, rv, len(parts))
    watcher.bookmark(rv, initial_events_end=True)
    assert_same_frames(kube, frames_of(watcher), "initial events")


def test_an_object_kube_cannot_print_is_sent_whole_in_a_watch() -> None:
    bad = CachedObject("ns/x", "ns", "x", 5, {}, {}, b'"metadata":{"name":"x","creationTimestamp":"never"}}')
    encoding = TableEncoding(printer_for(CONFIGMAPS), "v1", "Metadata", lambda: 0)
    assert encoding.build_frame(CONFIGMAPS, bad, "ADDED") == FULL_JSON.build_frame(CONFIGMAPS, bad, "ADDED")


@pytest.mark.parametrize(
    ("include", "row_object"),
    [
        # as kube-apiserver answers (asTable: Object is checked before the initial-events-end annotation)
        ("None", {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}),
        ("Metadata", {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}),
        ("Object", {"kind": "ConfigMap", "apiVersion": "v1"}),
    ],
)
def test_the_initial_events_end_bookmark_is_the_table_of_an_empty_object(include: str, row_object: dict) -> None:
    encoding = TableEncoding(printer_for(CONFIGMAPS), "v1", include, lambda: 0)
    frame = json.loads(encoding.bookmark_frame(CONFIGMAPS, 42, initial_events_end=True))
    assert frame["type"] == "BOOKMARK"
    table = frame["object"]
    assert table["metadata"] == {"resourceVersion": "42"} and table["columnDefinitions"] is None
    (row,) = table["rows"]
    assert row["cells"] == ["", 0, "<unknown>"]
    meta = {"resourceVersion": "42", "annotations": {"k8s.io/initial-events-end": "true"}}
    assert row["object"] == {**row_object, "metadata": meta}
    # a periodic bookmark: the row object as asked
    plain = json.loads(encoding.bookmark_frame(CONFIGMAPS, 43))["object"]["rows"][0]["object"]
    assert plain == (None if include == "None" else {**row_object, "metadata": {"resourceVersion": "43"}})

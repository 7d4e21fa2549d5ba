"""A custom resource's Table: its CRD's ``additionalPrinterColumns`` (apiextensions' tableconvertor).

kube-apiserver serves a custom resource's Table from the columns the CRD declares for the
version asked for (``spec.versions[].additionalPrinterColumns``; none declared: one ``Age``
column), after a ``Name`` column: each cell is the column's JSONPath evaluated on the object
(client-go's dialect, ``jsonpath.py``), shaped by the column's type — ``string``: what the
path finds, printed (a map or list as JSON); ``integer``/``number``/``boolean``: the JSON
value if it has that type; ``date``: the age of an RFC 3339 time (a hole: it depends on the
request's clock). A path that finds nothing, or fails, is an empty cell (null).

A printer is made per CRD object (``CustomPrinter.from_crd``), so a CRD that changes its
columns gives new printers, and rows derived for the old ones are derived again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from watchcache.printers.duration import ZERO_TIME, parse_time
from watchcache.printers.gofmt import go_json, go_print
from watchcache.printers.jsonpath import EvalError, JSONPath, JSONPathError
from watchcache.printers.kube import since
from watchcache.printers.row import Cell, Column, Row, Unprintable, build_row

NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources may "
    "allow a client to request the generation of an appropriate name automatically. Name is primarily intended "
    "for creation idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
CREATION_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. "
    "It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. "
    "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
NAME_COLUMN = Column("Name", "string", NAME_DESCRIPTION, "name")
DEFAULT_COLUMNS = [
    {"name": "Age", "type": "date", "description": CREATION_DESCRIPTION, "jsonPath": ".metadata.creationTimestamp"}
]
# OpenShift's apiextensions adds a column to this one kind (patch_clusteroperators.go): not ported.
_PATCHED = ("config.openshift.io", "v1", "ClusterOperator")


class UnsupportedColumns(Exception):
    """The CRD's columns cannot be rendered exactly as kube renders them (see ``jsonpath.py``)."""


class CustomPrinter:
    """The Table convertor of one version of one CRD (as of one CRD object)."""

    def __init__(self, kind: str, api_version: str, columns: Sequence[Column], paths: Sequence[JSONPath]) -> None:
        self.kind = kind
        self.api_version = api_version
        self.columns = [NAME_COLUMN, *columns]
        self.paths = list(paths)
        self.types = [c.type for c in columns]
        self.null_when_empty = False

    def __repr__(self) -> str:
        return f"CustomPrinter({self.api_version}, {self.kind}, {[c.name for c in self.columns]})"

    @classmethod
    def from_crd(cls, crd: dict[str, Any], version: str) -> CustomPrinter:
        """The printer kube builds for ``version`` of ``crd`` (decoded JSON); raises ``UnsupportedColumns``."""
        spec = crd.get("spec") or {}
        group = spec.get("group") or ""
        kind = (spec.get("names") or {}).get("kind") or ""
        if (group, version, kind) == _PATCHED:
            raise UnsupportedColumns("OpenShift's ClusterOperator columns")
        for entry in spec.get("versions") or []:
            if entry.get("name") == version:
                declared = entry.get("additionalPrinterColumns") or DEFAULT_COLUMNS
                break
        else:
            raise UnsupportedColumns(f"version {version} not found in {crd.get('metadata', {}).get('name')}")
        columns: list[Column] = []
        paths: list[JSONPath] = []
        for col in declared:
            path = col.get("jsonPath") or ""
            try:
                paths.append(JSONPath.compile("{" + path + "}"))
            except JSONPathError as e:
                # kube keeps the columns before the one it cannot parse: not ours to guess at.
                raise UnsupportedColumns(f"column {col.get('name')!r}: {e}") from None
            description = col.get("description") or f"Custom resource definition column (in JSONPath format): {path}"
            columns.append(
                Column(col.get("name") or "", col.get("type") or "", description, col.get("format") or "",
                       int(col.get("priority") or 0))
            )  # fmt: skip
        api_version = f"{group}/{version}" if group else version
        return cls(kind, api_version, columns, paths)

    def row(self, obj: dict[str, Any]) -> Row:
        # An unstructured object: the JSONPath sees its kind and apiVersion too.
        content = {"kind": self.kind, "apiVersion": self.api_version, **obj}
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise Unprintable("no metadata")
        name = meta.get("name")
        cells: list[Cell] = [name if isinstance(name, str) else ""]
        for path, kind in zip(self.paths, self.types, strict=True):
            try:
                results = path.find_results(content)
            except EvalError:
                cells.append(None)
                continue
            if not results or not results[0]:
                cells.append(None)
                continue
            value = results[0][0]
            cells.append(_string_cell(value) if kind == "string" else _typed_cell(kind, value))
        return build_row(cells)


def _string_cell(value: Any) -> Cell:
    """``PrintResults`` of one value: a map or list as JSON, null as ``<no value>``, else ``fmt.Fprint``."""
    if value is None:
        return "<no value>"
    if isinstance(value, (dict, list)):
        return go_json(value)
    return go_print(value)


def _typed_cell(kind: str, value: Any) -> Cell:
    """``cellForJSONValue``."""
    if value is None:
        return None
    if kind == "integer":
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value) if -(2**63) <= value < 2**63 else None
        return None
    if kind == "number":
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            return float(value)
        return None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "string":
        return value if isinstance(value, str) else None
    if kind == "date":
        if not isinstance(value, str):
            return None
        if value in ("", "null"):  # metav1.Time's UnmarshalQueryParameter: the zero time
            return since(ZERO_TIME)
        at = parse_time(value)
        return "<invalid>" if at is None else since(at)
    return None

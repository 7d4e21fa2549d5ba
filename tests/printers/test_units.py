"""The pieces under the printers: ages, times, Go's formatting, client-go's JSONPath, selectors, rows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchcache.printers import kube
from watchcache.printers.crd import CustomPrinter, UnsupportedColumns
from watchcache.printers.duration import HOUR, MINUTE, SECOND, ZERO_TIME, human_duration, parse_time
from watchcache.printers.gofmt import go_json, go_json_float, go_print_float, json_string
from watchcache.printers.jsonpath import EvalError, JSONPath, JSONPathError
from watchcache.printers.row import Since, Unprintable, build_row
from watchcache.printers.table import TableEncoding
from watchcache.resources import ResourceType

DAY = 24 * HOUR


@pytest.mark.parametrize(
    ("d", "text"),
    [
        (-3 * SECOND, "<invalid>"), (-2 * SECOND + 1, "0s"), (-SECOND // 2, "0s"), (0, "0s"), (59 * SECOND, "59s"),
        (119 * SECOND + SECOND - 1, "119s"), (2 * MINUTE, "2m"), (2 * MINUTE + 5 * SECOND, "2m5s"),
        (9 * MINUTE + 59 * SECOND, "9m59s"), (10 * MINUTE + 30 * SECOND, "10m"), (3 * HOUR - 1, "179m"),
        (3 * HOUR, "3h"), (7 * HOUR + 59 * MINUTE, "7h59m"), (8 * HOUR + 30 * MINUTE, "8h"), (47 * HOUR, "47h"),
        (48 * HOUR, "2d"), (49 * HOUR, "2d1h"), (8 * DAY - 1, "7d23h"), (8 * DAY, "8d"), (729 * DAY, "729d"),
        (731 * DAY, "2y1d"), (8 * 365 * DAY, "8y"), (20 * 365 * DAY + 5 * DAY, "20y"),
    ],
)  # fmt: skip
def test_human_duration_is_apimachinerys(d: int, text: str) -> None:
    assert human_duration(d) == text


def test_times_parse_as_gos_rfc3339() -> None:
    assert parse_time("1970-01-01T00:00:01Z") == SECOND
    assert parse_time("1970-01-01T01:00:00+01:00") == 0
    assert parse_time("1970-01-01T00:00:00.5Z") == SECOND // 2
    assert parse_time("0001-01-01T00:00:00Z") == ZERO_TIME
    for bad in ("yesterday", "2024-02-30T00:00:00Z", "2024-01-01 00:00:00Z", "2024-01-01T24:00:00Z", "", None, 5):
        assert parse_time(bad) is None


def test_floats_print_as_go_prints_them() -> None:
    # checked against go1.27: fmt.Sprint(f) and json.Marshal(f)
    cases = {1e6: ("1e+06", "1000000"), 100000.0: ("100000", "100000"), 123456789.0: ("1.23456789e+08", "123456789"),
             1.5: ("1.5", "1.5"), 1e21: ("1e+21", "1e+21"), 1e20: ("1e+20", "100000000000000000000"),
             1e-5: ("1e-05", "0.00001"), 0.0001: ("0.0001", "0.0001"), -2.5e-7: ("-2.5e-07", "-2.5e-7"),
             3.0: ("3", "3"), 0.1: ("0.1", "0.1")}  # fmt: skip
    for f, (printed, marshalled) in cases.items():
        assert (go_print_float(f), go_json_float(f)) == (printed, marshalled), f


def test_json_is_gos_encoding_json() -> None:
    assert json_string("<none> & \u2028\b\x01") == '"\\u003cnone\\u003e \\u0026 \\u2028\\b\\u0001"'
    assert go_json({"b": [1, 2.5, True, None], "a": "x"}) == '{"a":"x","b":[1,2.5,true,null]}'


DATA = {
    "kind": "Widget",
    "spec": {"n": 3, "list": [1, 2, 3, 4], "a.b": "dotted", "null": None, "mixed": [{"k": 1}, {"k": "1"}]},
    "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]},
}


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("{.spec.n}", [3]),
        ("{.kind}", ["Widget"]),
        ('{.status.conditions[?(@.type=="Ready")].status}', ["True"]),
        ("{.status.conditions[?(@.type!='Ready')].type}", ["Synced"]),
        ("{.status.conditions[?(@.status)].type}", ["Ready", "Synced"]),
        ("{.spec.list[1:3]}", [2, 3]),
        ("{.spec.list[-1]}", [4]),
        ("{.spec.list[::2]}", [1, 3]),
        ("{.spec.list[0,2]}", [1, 3]),
        ("{.spec.list[*]}", [1, 2, 3, 4]),
        ("{.spec['a.b']}", []),  # client-go splits a quoted key on its dots
        ("{.spec.missing.deeper}", []),
        ("{.spec.null}", [None]),
        ("{$.spec.n}", [3]),
    ],
)
def test_jsonpath_finds_what_client_go_finds(path: str, found: list) -> None:  # type: ignore[type-arg]
    assert JSONPath.compile(path).find_results(DATA)[0] == found


@pytest.mark.parametrize(
    "path", ["{.spec.list[9]}", "{.spec.n[0]}", "{.spec.list[3:1]}", "{.spec.mixed[?(@.k==1)].k}", "{.spec[?(@.x)]}"]
)
def test_jsonpath_errors_where_client_go_errs(path: str) -> None:
    with pytest.raises(EvalError):
        JSONPath.compile(path).find_results(DATA)


@pytest.mark.parametrize("path", ["{.spec.*}", "{..n}", "{range .x}{end}", "{.a", "{.spec[1.2.3]}", "{.x[?(@.a==1}"])
def test_jsonpath_refuses_what_it_cannot_render_as_kube(path: str) -> None:
    with pytest.raises(JSONPathError):
        JSONPath.compile(path)


def test_label_selectors_print_as_apimachinery_prints_them() -> None:
    expressions = [{"key": "tier", "operator": "NotIn", "values": ["b", "a"]}, {"key": "app", "operator": "Exists"},
                   {"key": "zone", "operator": "DoesNotExist"}]  # fmt: skip
    selector = {"matchLabels": {"app": "web"}, "matchExpressions": expressions}
    assert kube.selector_string(selector) == "app=web,app,tier notin (a,b),!zone"
    assert kube.format_label_selector(None) == "<none>"
    assert kube.format_label_selector({}) == "<none>"
    assert kube.format_label_selector({"matchExpressions": [{"key": "a", "operator": "Near"}]}) == "<error>"
    assert kube.format_labels({"b": "2", "a": "1"}) == "a=1,b=2"
    assert kube.format_labels({}) == "<none>"


def test_node_roles_come_from_labels() -> None:
    labels = {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/": "x", "kubernetes.io/role": "w"}
    assert kube.node_roles(labels) == ["control-plane", "w"]


def test_a_row_leaves_holes_for_the_ages() -> None:
    row = build_row(["a<b", 3, None, True, 1.5, Since(0), Since(60 * SECOND, "2 (", " ago)")], [])
    assert row.stamps == (0, 60 * SECOND)
    assert row.render(125 * SECOND) == b'{"cells":["a\\u003cb",3,null,true,1.5,"2m5s","2 (65s ago)"]'
    with_conditions = build_row(["x"], [{"type": "Completed", "status": "True", "reason": "", "message": "m"}])
    conditions = b'"conditions":[{"type":"Completed","status":"True","message":"m"}]'
    assert with_conditions.render(0) == b'{"cells":["x"],' + conditions  # the row's object comes next


def test_printers_refuse_values_kube_could_not_decode() -> None:
    with pytest.raises(Unprintable):
        kube.POD.row({"metadata": {"name": "x", "creationTimestamp": "never"}})
    with pytest.raises(Unprintable):
        kube.POD.row({"metadata": {"name": "x"}, "status": {"containerStatuses": {"not": "a list"}}})
    with pytest.raises(Unprintable):  # schema.ParseGroupVersion's error: kube's Table request fails
        kube.CONTROLLER_REVISION.row({"metadata": {"name": "r", "ownerReferences": [
            {"apiVersion": "a/b/c", "kind": "X", "name": "y", "controller": True}]}})  # fmt: skip


def test_an_empty_default_table_has_null_rows() -> None:
    roles = ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True)
    assert kube.builtin_printer("rbac.authorization.k8s.io", "roles") is kube.DEFAULT
    parts = TableEncoding(kube.DEFAULT, "v1", "Metadata", lambda: 0).list_parts(roles, [], 7, None, None)
    assert b"".join(parts).endswith(b',"rows":null}')
    pods = ResourceType("", "v1", "pods", "Pod", True)
    parts = TableEncoding(kube.POD, "v1", "Metadata", lambda: 0).list_parts(pods, [], 7, None, None)
    assert b"".join(parts).endswith(b',"rows":[]}')


def test_crd_columns_default_to_age_and_refuse_what_kube_would_print_at_random() -> None:
    everything = [{"name": "All", "type": "string", "jsonPath": ".spec.*"}]
    crd = {"spec": {"group": "g.io", "names": {"kind": "K"},
                    "versions": [{"name": "v1"}, {"name": "v2", "additionalPrinterColumns": everything}]}}  # fmt: skip
    v1 = CustomPrinter.from_crd(crd, "v1")
    assert [(c.name, c.type) for c in v1.columns] == [("Name", "string"), ("Age", "date")]
    with pytest.raises(UnsupportedColumns):
        CustomPrinter.from_crd(crd, "v2")
    with pytest.raises(UnsupportedColumns):
        CustomPrinter.from_crd(crd, "v3")


def test_a_printers_bug_is_contained_to_its_watch_frame() -> None:
    """Raising would end every watcher of the resource (the dispatcher's last resort): the frame carries
    the object instead, as kube's watch does when a conversion fails."""
    from tests.support.factories import pod
    from watchcache.cache.encoding import FULL_JSON
    from watchcache.resources import PODS

    class Broken:
        columns = kube.POD.columns
        null_when_empty = False

        def row(self, obj: dict) -> None:  # type: ignore[type-arg]
            raise ZeroDivisionError

    encoding = TableEncoding(Broken(), "v1", "Metadata", lambda: 0)  # type: ignore[arg-type]
    obj = pod("p", rv=3)
    assert encoding.build_frame(PODS, obj, "ADDED") == FULL_JSON.build_frame(PODS, obj, "ADDED")
    assert encoding.bookmark_frame(PODS, 4) == FULL_JSON.bookmark_frame(PODS, 4)


@given(
    st.lists(
        st.one_of(
            st.text(), st.integers(-(2**70), 2**70), st.booleans(), st.none(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.builds(Since, st.integers(0, 2**62), st.text(), st.text()),
        ),
        max_size=8,
    )
)  # fmt: skip
def test_rows_are_written_as_go_writes_each_cell(cells: list) -> None:  # type: ignore[type-arg]
    """The fast path (orjson for runs of cells, then Go's escapes) equals Go's encoding cell by cell."""
    row = build_row(cells)
    expected_pieces, text = [], '{"cells":['
    for i, cell in enumerate(cells):
        text += "," if i else ""
        if isinstance(cell, Since):
            expected_pieces.append((text + json_string(cell.prefix)[:-1]).encode())
            text = json_string(cell.suffix)[1:]
        else:
            text += go_json(cell)
    expected_pieces.append((text + "]").encode())
    assert row.pieces == tuple(expected_pieces)

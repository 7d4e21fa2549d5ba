"""Selectable fields: the compiled extractor (one walk per object) against one path walk per field."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from watchcache.resources import BUILTIN, NODES, PODS, _path_getter, compile_fields


class _Str(str):
    pass


_SEGMENTS = ("spec", "status", "metadata", "nodeName", "phase", "name", "a.b", "it's")

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.text(max_size=3).map(_Str),
    st.lists(st.integers(), max_size=2),
)


def _maps(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    plain = st.dictionaries(st.sampled_from(_SEGMENTS), children, max_size=4)
    return st.one_of(plain, plain.map(types.MappingProxyType))  # a Mapping that is not a dict


_values = st.recursive(_leaves, _maps, max_leaves=12)
_paths = st.lists(
    st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=3).map(".".join), min_size=1, max_size=6, unique=True
)


def _reference(paths: list[str], obj: Any) -> dict[str, str]:
    return {p: _path_getter(p)(obj) for p in paths}


@settings(max_examples=400, deadline=None)
@given(paths=_paths, obj=_maps(_values))
def test_compiled_fields_equal_one_walk_per_field(paths: list[str], obj: Any) -> None:
    assert compile_fields(paths)(obj) == _reference(paths, obj)


def test_every_builtin_extracts_its_selectable_fields_in_their_order() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "hostNetwork": True, "restartPolicy": 7},
        "status": {"phase": "Running", "podIP": None},
    }
    fields = PODS.extract_fields(pod)
    assert list(fields) == list(PODS.getters)
    assert fields["spec.nodeName"] == "n1"
    assert fields["spec.hostNetwork"] == "true"
    assert fields["spec.restartPolicy"] == "7"
    assert fields["status.podIP"] == ""
    assert fields["spec.schedulerName"] == ""
    for resource in BUILTIN:
        assert resource.extract_fields(pod) == {p: get(pod) for p, get in resource.getters.items()}
        zeros = {p: "false" if p in ("spec.hostNetwork", "spec.unschedulable") else "" for p in resource.getters}
        assert resource.extract_fields({}) == zeros


@settings(max_examples=200, deadline=None)
@given(paths=_paths, obj=_maps(_values), data=st.data())
def test_compiled_fields_equal_one_walk_per_field_with_false_zeros(paths: list[str], obj: Any, data: Any) -> None:
    falses = data.draw(st.lists(st.sampled_from(paths), unique=True))
    zeros = dict.fromkeys(falses, "false")
    reference = {p: _path_getter(p, zeros.get(p, ""))(obj) for p in paths}
    assert compile_fields(paths, zeros)(obj) == reference


def test_an_omitted_bool_selects_as_false_as_on_kubes_typed_objects() -> None:
    # kube: strconv.FormatBool(pod.Spec.HostNetwork), FormatBool(node.Spec.Unschedulable).
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}}
    assert PODS.extract_fields(pod)["spec.hostNetwork"] == "false"
    assert PODS.getters["spec.hostNetwork"](pod) == "false"
    assert PODS.extract_fields({"metadata": {"name": "p"}})["spec.hostNetwork"] == "false"
    assert PODS.extract_fields(pod)["spec.restartPolicy"] == ""  # a string's absence stays ""
    assert NODES.extract_fields({"metadata": {"name": "n"}, "spec": {}})["spec.unschedulable"] == "false"
    assert NODES.extract_fields({"metadata": {"name": "n"}, "spec": {"unschedulable": True}})["spec.unschedulable"] == (
        "true"
    )

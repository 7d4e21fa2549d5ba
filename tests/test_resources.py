"""Selectable fields: the compiled extractor (one walk per object) against one path walk per field."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from watchcache.resources import BUILTIN, PODS, _path_getter, compile_fields


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
        assert resource.extract_fields(pod) == _reference(list(resource.getters), pod)
        assert resource.extract_fields({}) == dict.fromkeys(resource.getters, "")

"""``wire.scope_summary``: the scope proof's reading of a protobuf PartialObjectMetadataList.

It parses through ``VersionsList``, a view that names only the versions; these tests build the
list with the full messages (every field kube writes, so the view must skip them) and check the
view reads the same rv, count and newest item rv, and refuses what is not such a list.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchcache.kubeproto import meta_pb2 as pb
from watchcache.kubeproto import wire


def _body(list_rv: str, item_rvs: list[str], kind: str = "PartialObjectMetadataList") -> bytes:
    msg = pb.PartialObjectMetadataList()
    msg.metadata.resourceVersion = list_rv
    msg.metadata.remainingItemCount = 0
    for i, rv in enumerate(item_rvs):
        meta = msg.items.add().metadata
        meta.name, meta.namespace, meta.uid, meta.resourceVersion = f"cm-{i}", "ns", f"uid-{i}", rv
        meta.labels["app"] = "x" * i
        meta.annotations["rv"] = rv  # a string like the version, elsewhere in the item
        entry = meta.managedFields.add()
        entry.manager, entry.operation, entry.fieldsV1.Raw = "kubectl", "Update", b'{"f:data":{}}'
        meta.creationTimestamp.seconds = 1_700_000_000 + i
    return wire.envelope(wire.type_meta("meta.k8s.io/v1", kind), msg.SerializeToString())


@given(st.integers(1, 10**12), st.lists(st.integers(1, 10**12), max_size=40))
def test_reads_the_lists_rv_count_and_newest_item(list_rv: int, item_rvs: list[int]) -> None:
    body = _body(str(list_rv), [str(rv) for rv in item_rvs])
    assert wire.scope_summary(body) == (list_rv, len(item_rvs), max(item_rvs, default=0))


def test_an_empty_scope_has_no_newest_item() -> None:
    assert wire.scope_summary(_body("42", [])) == (42, 0, 0)


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"ConfigMapList"}',  # JSON, not protobuf
        _body("1", ["1"], kind="ConfigMapList"),  # full objects, not their metadata
        wire.MAGIC + b"\xff\xff\xff",  # not a message
        _body("1", ["not-a-number"]),
        _body("", []),
    ],
)
def test_anything_else_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        wire.scope_summary(body)

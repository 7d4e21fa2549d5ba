"""ListMeta in protobuf as kube v1.36 writes it, shardInfo (field 5, KEP-5866) included."""

from __future__ import annotations

from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]

from watchcache.kubeproto import meta_pb2 as pb
from watchcache.kubeproto.wire import list_meta


def fields(data: bytes) -> list[tuple[int, bytes | int]]:
    """(field number, value) in wire order: length-delimited values as bytes, varints as ints."""
    out: list[tuple[int, bytes | int]] = []
    i = 0
    while i < len(data):
        key, i = _DecodeVarint(data, i)
        if key & 7 == 2:
            n, i = _DecodeVarint(data, i)
            out.append((key >> 3, data[i : i + n]))
            i += n
        else:
            value, i = _DecodeVarint(data, i)
            out.append((key >> 3, value))
    return out


def test_a_sharded_list_carries_its_selector_after_the_other_fields() -> None:
    selector = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    got = fields(list_meta("42", "tok", 7, selector))
    assert [f for f, _ in got] == [1, 2, 3, 4, 5]
    assert fields(got[-1][1]) == [(1, selector.encode())]  # type: ignore[arg-type]
    plain = pb.ListMeta.FromString(list_meta("42", "tok", 7, selector))  # older readers skip field 5
    assert (plain.resourceVersion, getattr(plain, "continue"), plain.remainingItemCount) == ("42", "tok", 7)


def test_an_unsharded_list_has_no_shard_info() -> None:
    assert [f for f, _ in fields(list_meta("42"))] == [1, 2, 3]

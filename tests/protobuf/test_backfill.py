"""A protobuf watch from before its cache's window: backfilled from the upstream in protobuf, as a JSON watch is.

Against the recorded kube-apiserver (a real socket): a protobuf cache that listed at the recorded
``R`` and kept only its newest event (``history_max_events=1``) is asked for a watch from ``R``.
The upstream backfill (``upstream/backfill.py`` with ``pbreflector.ProtobufCodec``) lists at
``R`` and watches from it in protobuf, and the watcher gets kube-apiserver's own watch frames,
byte for byte. Without a backfill (``--no-backfill``) the same watch gets 410, as a JSON one does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from harness.doubles import NullSink
from tests.dispatch.readctx import ReadCtx
from tests.protobuf.recorded import RecordedUpstream, b
from watchcache import apierrors
from watchcache.cache.object import CachedObject
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.protobuf import FULL_PROTOBUF
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.dispatch import reads
from watchcache.dispatch.backfill import BackfillLimits
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.outcomes import Expired
from watchcache.resources import PODS
from watchcache.upstream.backfill import UpstreamBackfill
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.pbreflector import ProtobufCodec

ALL = SelectionPredicate.parse(PODS, None, "", "")


@pytest.fixture(scope="module")
def released(upstream: RecordedUpstream) -> Iterator[RecordedUpstream]:
    upstream.release()  # the recorded changes after R reach protobuf watches
    yield upstream


def from_rv(rv: int) -> WatchPlan:
    return WatchPlan(Mode.EXACT, rv, initial_events=False, initial_events_end_bookmark=False)


def state_after(record: dict[str, Any], events: list[bytes]) -> tuple[list[CachedObject], int]:
    """kube's pods at R (the recorded list) with ``events`` applied: the state at the last one's rv."""
    codec = ProtobufCodec(PODS)
    scratch = Cacher(PODS)
    rv, items, _ = codec.page(b(record["kinds"]["pods"]["protobuf"]))
    scratch.replace(items, rv)
    for frame in events:
        kind, obj, _ = codec.event(frame)
        assert obj is not None
        scratch.apply([(kind, obj)])
    return list(scratch.cache.snapshot().iter_range("", None)), scratch.rv


async def _watch_from_r(url: str, record: dict[str, Any], backfill: bool) -> bytes:
    """A protobuf cache that starts at kube's last recorded pod event (a proxy that started, or whose protobuf
    cache was made, after it): a watch from R, before its window."""
    client = UpstreamClient(UpstreamConfig(server=url))
    await client.start()
    cacher = Cacher(PODS)
    if backfill:
        fetch = UpstreamBackfill(client, BackfillLimits(coalesce=0.0))
        cacher.backfills = fetch.backfills(cacher, ProtobufCodec(PODS))
    objects, newest = state_after(record, [b(f) for f in record["watches"]["upstream-pods"][:-1]])
    cacher.replace(objects, newest)
    try:
        r = int(record["R"])
        assert cacher.cache.oldest_rv > r  # the window does not reach R
        started = await reads.start_watch(
            ReadCtx(), cacher, WatchRequest(ALL, from_rv(r), encoding=FULL_PROTOBUF), NullSink()
        )
        if isinstance(started, Expired):  # the read's owner answers it with kube's 410
            raise started.status()
        return b"".join(started.take()[0])
    finally:
        cacher.stop()
        await client.close()


def test_a_protobuf_watch_from_before_the_window_gets_kubes_frames_from_the_upstreams_history(
    released: RecordedUpstream, record: dict[str, Any]
) -> None:
    got = asyncio.run(_watch_from_r(released.url, record, backfill=True))
    events = [b(f) for f in record["watches"]["upstream-pods"][:-1]]  # kube's frames from R (not its bookmark)
    assert got == b"".join(len(f).to_bytes(4, "big") + f for f in events)
    assert len(events) == 2


def test_without_a_backfill_the_same_watch_gets_410(released: RecordedUpstream, record: dict[str, Any]) -> None:
    with pytest.raises(apierrors.StatusError) as e:
        asyncio.run(_watch_from_r(released.url, record, backfill=False))
    assert e.value.code == 410

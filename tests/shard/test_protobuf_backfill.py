"""A protobuf follower (the process wiring's, ``service.shard.protobuf_followers``) backfills from its owner.

Over a real follow stream on a unix socket, in one process: the owner's protobuf cache restarted
(its window starts at the upstream's head) and backfills from the ``Upstream`` model; a watch
from an older rv on the follower's worker — a typed client (kube-controller-manager, the
scheduler) resuming after the proxy restarted — brings the follower's window back through the
owner instead of a 410 and a relist. Before the follower was given the backfill limits, the same
read got ``BackfillFailed(OFF)``: kube's 410.
"""

from __future__ import annotations

from pathlib import Path

from harness.waiting import until
from tests.shard.test_backfill import Upstream, Worker, view
from tests.support.handlers import arun
from watchcache.dispatch.backfill import reach_back
from watchcache.resources import PODS
from watchcache.service.options import RunOptions
from watchcache.service.shard import protobuf_followers


@arun
async def test_a_protobuf_follower_reaches_back_through_its_owner(tmp_path: Path) -> None:
    up = Upstream()
    for i in range(20):
        up.write(f"p{i % 5}", str(i))
    worker = Worker(str(tmp_path / "w0.sock"), up.owner())  # restarted at rv 21
    worker.service.owned_protobuf = lambda rid: worker.cacher if rid == "pods" else None
    await worker.start()
    followers = protobuf_followers(lambda t: worker.path, 1, RunOptions())
    try:
        cacher = followers.ensure(PODS)
        await until(lambda: cacher.ready)
        assert cacher.cache.oldest_rv == 21
        assert await reach_back(cacher, 8, 5.0) is None
        assert view(cacher.cache.events_since(8)) == view(worker.cacher.cache.events_since(8))
        assert {o.key: o.rv for o in cacher.cache.snapshot(8).iter_range("", None)} == {
            f"ns/{n}": o.rv for n, o in up.state(8).items()
        }
        worker.cacher.apply([up.write("p1", "live")])  # and it keeps following
        await until(lambda: cacher.rv == up.rv)
    finally:
        followers.stop()
        worker.kill()

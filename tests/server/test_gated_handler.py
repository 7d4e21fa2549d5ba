"""ApiHandler with a Gate: what runs before authorization and what only after it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.support.factories import FakeResponse, pod
from tests.support.handlers import FakeUpstream
from watchcache import apierrors
from watchcache.auth.gate import Gate
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.http.request import Request
from watchcache.resources import CONFIGMAPS, PODS, ResourceRegistry, ResourceType
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.policy import load_policy
from watchcache.watchers.flush import FlushScheduler

EXAMPLE = Path(__file__).parents[2] / "watchcache" / "sim" / "policy-example.yaml"


class Followers:
    """``ctx.on_demand``: records every replica a request made the worker build."""

    def __init__(self, cachers: dict[ResourceType, Cacher]) -> None:
        self.cachers = cachers
        self.built: list[str] = []

    def __call__(self, resource: ResourceType) -> Cacher:
        self.built.append(resource.resource)
        cacher = self.cachers[resource] = Cacher(resource, CacheConfig())
        cacher.replace([], 10)
        return cacher


def handler() -> tuple[ApiHandler, Followers]:
    pods = Cacher(PODS, CacheConfig())
    pods.replace([pod("p0", rv=1)], 10)
    cachers = {PODS: pods}
    followers = Followers(cachers)
    ctx = ApiContext(
        registry=ResourceRegistry((PODS, CONFIGMAPS)),
        cachers=cachers,
        upstream=FakeUpstream(),
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(asyncio.get_running_loop()),
        on_demand=followers,
        gate=Gate.build(LocalReviewClient(load_policy(EXAMPLE))),
    )
    return ApiHandler(ctx, forward_tables=True), followers


async def send(h: ApiHandler, path: str, token: str | None = None, **headers: str) -> tuple[int, dict]:
    hdrs = {k.lower(): v for k, v in headers.items()}
    if token:
        hdrs["authorization"] = f"Bearer {token}"
    req = Request("GET", path.encode(), path.split("?", 1)[0], {}, hdrs, b"", "1.1", "test")
    resp = FakeResponse()
    try:
        await h(req, resp)
    except apierrors.StatusError as e:
        resp.send(e.code, e.body())
    assert resp.status is not None
    json = resp.body.startswith(b"{")
    return resp.status, orjson.loads(resp.body) if json else {}


@pytest.mark.parametrize(("token", "status"), [("not-a-token", 401), (None, 403), ("dave-token", 403)])
def test_a_refused_read_builds_no_follower(token: str | None, status: int) -> None:
    asyncio.run(_refused_read_builds_no_follower(token, status))


async def _refused_read_builds_no_follower(token: str | None, status: int) -> None:
    h, followers = handler()
    assert (await send(h, "/api/v1/namespaces/ns-1/configmaps", token))[0] == status
    assert followers.built == []
    assert (await send(h, "/api/v1/namespaces/ns-1/configmaps", "alice-token"))[0] == 200
    assert followers.built == ["configmaps"]


def test_a_read_that_passes_through_builds_no_follower() -> None:
    asyncio.run(_read_that_passes_through_builds_no_follower())


async def _read_that_passes_through_builds_no_follower() -> None:
    h, followers = handler()
    await send(h, "/api/v1/namespaces/ns-1/configmaps", "alice-token", Accept="application/yaml")
    await send(h, "/api/v1/namespaces/ns-1/configmaps", "alice-token", Accept="application/vnd.kubernetes.protobuf")
    assert followers.built == []
    assert h.passed_through == {"media-type": 1, "protobuf": 1}


@pytest.mark.parametrize("path", ["/metrics", "/debug/cache", "/debug/shards"])
def test_own_endpoints_need_a_grant_on_their_path(path: str) -> None:
    asyncio.run(_own_endpoints_need_a_grant_on_their_path(path))


async def _own_endpoints_need_a_grant_on_their_path(path: str) -> None:
    h, _ = handler()

    async def route() -> bytes:
        return b"{}"

    h.routes.update({"/metrics": route, "/debug/shards": route})
    status, body = await send(h, path, "dave-token")
    assert status == 403 and body["message"] == f'forbidden: User "dave" cannot get path "{path}"'
    assert (await send(h, path, "prometheus-token"))[0] == 200
    for health in ("/healthz", "/livez", "/readyz"):
        assert (await send(h, health))[0] == 200


@pytest.mark.parametrize("path", ["/api/v1/namespaces/default/pods", "/api/v1/namespaces/default/pods?watch=1",
                                  "/debug/cache"])  # fmt: skip
@pytest.mark.parametrize(("token", "status"), [("not-a-token", 401), ("dave-token", 403)])
def test_refusals_are_in_protobuf_for_a_protobuf_client_as_from_kube(path: str, token: str, status: int) -> None:
    # kube-apiserver negotiates its 401/403 Status like any error: client-go's typed clients
    # ("application/vnd.kubernetes.protobuf,application/json") get it in protobuf.
    async def run() -> None:
        h, _ = handler()
        accept = "application/vnd.kubernetes.protobuf,application/json"
        hdrs = {"authorization": f"Bearer {token}", "accept": accept}
        req = Request("GET", path.encode(), path.split("?", 1)[0], {}, hdrs, b"", "1.1", "test")
        with pytest.raises(apierrors.StatusError) as e:
            await h(req, FakeResponse())
        assert e.value.code == status
        assert e.value.content_type == "application/vnd.kubernetes.protobuf"
        assert e.value.body().startswith(b"k8s\x00")
        hdrs["accept"] = "application/json"
        req = Request("GET", path.encode(), path.split("?", 1)[0], {}, hdrs, b"", "1.1", "test")
        with pytest.raises(apierrors.StatusError) as e:
            await h(req, FakeResponse())
        assert (e.value.code, e.value.content_type) == (status, "application/json")

    asyncio.run(run())


def test_a_kind_never_cached_here_is_passed_through_before_any_review() -> None:
    asyncio.run(_a_kind_never_cached_is_passed_through_before_any_review())


async def _a_kind_never_cached_is_passed_through_before_any_review() -> None:
    # --cache-exclude configmaps: the upstream authorizes its client; no review here, and dave (whom
    # the example policy refuses configmaps) gets the upstream's answer, not this proxy's 403.
    h, followers = handler()
    h.ctx.never_cached = lambda resource: resource is CONFIGMAPS
    gate = h.ctx.gate
    assert gate is not None
    checked: list[object] = []
    authorize = gate.authorize

    async def counted(*args: object, **kwargs: object) -> object:
        checked.append(args)
        return await authorize(*args, **kwargs)  # type: ignore[arg-type]

    gate.authorize = counted  # type: ignore[method-assign]
    # (The fake upstream answers every forwarded request 404.)
    assert (await send(h, "/api/v1/namespaces/ns-1/configmaps", "dave-token"))[0] == 404
    assert (await send(h, "/api/v1/namespaces/ns-1/configmaps?watch=1", "alice-token"))[0] == 404
    assert checked == [] and followers.built == []
    assert h.passed_through == {"uncached-resource": 2}
    assert isinstance(h.ctx.upstream, FakeUpstream) and len(h.ctx.upstream.forwarded) == 2
    # A kind that may be cached is still authorized before its cache is built.
    assert (await send(h, "/api/v1/namespaces/ns-1/pods", "alice-token"))[0] == 200
    assert len(checked) == 1

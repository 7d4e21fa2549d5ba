"""Work estimates through real processes: the proxy in front of the simulated cluster, delegated
authentication, kube's suggested configuration, --max-requests-inflight 400 (global-default: 33
nominal seats, at most 5 for one request: min(ceil(15% of 33), 33 / hand size 6)).

A LIST of every pod (about 1 MB and more) is estimated as kube estimates a read from its watch
cache, 10 seats (1 MB at most held at once, 100 kB a seat), capped at the level's 5; a page of
one pod and a GET take one seat. kube's ``apiserver_flowcontrol_work_estimated_seats`` shows it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import Proc, start_stack

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
LABELS = (("flow_schema", "global-default"), ("priority_level", "global-default"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("apfwidth") / "token"
    token_file.write_text("watchcache-token")
    stack = start_stack(
        "--token-file", str(token_file), "--authentication", "delegated", "--workers", "1",
        sim_args=("--objects", "1500", "--namespaces", "3", "--policy-file", POLICY),
    )  # fmt: skip
    yield stack.sim, stack.proxy
    stack.stop()


async def _get(session: aiohttp.ClientSession, url: str, token: str) -> tuple[int, bytes]:
    headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
    async with session.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


def _estimates(proxy: Proc) -> dict[str, float]:
    """The work_estimated_seats histogram of global-default: its buckets (by le), _sum and _count."""

    async def scrape() -> str:
        async with aiohttp.ClientSession() as s:
            status, body = await _get(s, proxy.url + "/metrics", "admin-token")
            assert status == 200
            return body.decode()

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(asyncio.run(scrape())):
        if family.name != "apiserver_flowcontrol_work_estimated_seats":
            continue
        for s in family.samples:
            labels = dict(s.labels)
            le = labels.pop("le", None)
            if tuple(sorted(labels.items())) == LABELS:
                out[le if le is not None else s.name.rsplit("_", 1)[1]] = s.value
    return out


def test_a_big_list_is_estimated_at_the_levels_maximum_and_a_get_at_one_seat(stack: tuple[Proc, Proc]) -> None:
    _, proxy = stack

    async def reads() -> list[tuple[int, bytes]]:
        async with aiohttp.ClientSession() as s:
            full = await _get(s, proxy.url + "/api/v1/pods", "alice-token")
            page = await _get(s, proxy.url + "/api/v1/pods?limit=1", "alice-token")
            meta = orjson.loads(page[1])["items"][0]["metadata"]
            one = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}?resourceVersion=0"
            return [full, page, await _get(s, proxy.url + one, "alice-token")]

    before = _estimates(proxy)
    (full, body), (page, _), (get, _) = asyncio.run(reads())
    assert (full, page, get) == (200, 200, 200)
    pods = orjson.loads(body)["items"]
    assert len(pods) == 1500 and len(body) > 1_000_000  # over kube's 1 MB: 10 seats before the level's cap
    after = _estimates(proxy)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["count"] == 3
    assert delta["sum"] == 5 + 1 + 1, delta
    assert delta["1.0"] == 2 and delta["4.0"] == 2 and delta["8.0"] == 3, delta

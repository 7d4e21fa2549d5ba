"""The kubelet-shaped benchmarks' client: framing, and what it reads from frames and LIST bodies.

Protobuf inputs are built with watchcache's own encoder (the bytes equal kube-apiserver's), JSON
ones as kube writes them. A smoke run of both benchmarks against the simulated cluster, in
seconds, checks that the pieces fit: every write arrives at its kubelet, and the relist storm
reaches the upstream once per resource at most.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadtest.bench.kubeclient import (
    FrameSplitter,
    frame_stamp,
    frame_type,
    json_event_rv,
    list_meta,
    pb_event_rv,
    query,
)
from watchcache.kubeproto import wire

ROOT = Path(__file__).resolve().parents[2]
STAMP = "1795780969.342838"


def pb_pod_event(event_type: bytes, rv: str, stamp: str) -> bytes:
    meta = wire.object_meta(
        {"name": "p", "namespace": "ns", "resourceVersion": rv, "annotations": {"bench/written-at": stamp}}
    )
    pod = wire.delimited(1, len(meta)) + meta + wire.delimited(2, 4) + b"\x0a\x02\x08\x01"
    return wire.watch_frame(event_type, wire.envelope(wire.type_meta("v1", "Pod"), pod))


def json_pod_event(event_type: str, rv: str, stamp: str) -> bytes:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "resourceVersion": rv, "annotations": {"bench/written-at": stamp}},
        "spec": {"nodeName": "n"},
    }
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def test_protobuf_frames_are_cut_at_their_length_prefix_whatever_the_reads() -> None:
    stream = pb_pod_event(b"MODIFIED", "41", STAMP) + pb_pod_event(b"BOOKMARK", "42", "0")
    for cut in (1, 3, 4, 5, 17, len(stream) - 1):
        splitter = FrameSplitter(protobuf=True)
        frames = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert [frame_type(f) for f in frames] == ["MODIFIED", "BOOKMARK"]
        assert [pb_event_rv(f) for f in frames] == ["41", "42"]
        assert frame_stamp(frames[0]) == STAMP


def test_json_lines_are_cut_at_newlines_whatever_the_reads() -> None:
    stream = json_pod_event("ADDED", "7", STAMP) + json_pod_event("DELETED", "8", STAMP)
    for cut in (1, 10, len(stream) // 2, len(stream) - 1):
        splitter = FrameSplitter(protobuf=False)
        frames = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert [frame_type(f) for f in frames] == ["ADDED", "DELETED"]
        assert [json_event_rv(f) for f in frames] == ["7", "8"]
        assert [frame_stamp(f) for f in frames] == [STAMP, STAMP]


def test_an_event_without_the_stamp_has_none() -> None:
    assert frame_stamp(json_pod_event("MODIFIED", "1", STAMP).replace(b"bench/", b"other/")) is None


@pytest.mark.parametrize("keep", [None, 60], ids=["whole", "first-bytes"])
def test_list_meta_reads_rv_and_continue_from_a_protobuf_list(keep: int | None) -> None:
    lm = wire.list_meta("11016", "eyJ2IjoibWV0YS")
    items = b"".join(wire.delimited(2, 300) + b"x" * 300 for _ in range(3))
    body = wire.envelope(wire.type_meta("v1", "PodList"), wire.delimited(1, len(lm)) + lm + items)
    assert list_meta(body[:keep], "application/vnd.kubernetes.protobuf") == ("11016", "eyJ2IjoibWV0YS")


def test_list_meta_reads_rv_and_continue_from_a_json_list() -> None:
    body = json.dumps(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "9", "continue": "abc"},
            "items": [{"metadata": {"resourceVersion": "3"}}],
        }
    ).encode()
    assert list_meta(body, "application/json") == ("9", "abc")
    last = body.replace(b', "continue": "abc"', b"")
    assert list_meta(last, "application/json") == ("9", "")


def test_query_quotes_selectors_and_continue_tokens() -> None:
    assert query(fieldSelector="spec.nodeName=n-1", limit=500, resourceVersion="0", watch=True, x=None) == (
        "?fieldSelector=spec.nodeName%3Dn-1&limit=500&resourceVersion=0&watch=true"
    )
    assert query(**{"continue": "a/b=="}) == "?continue=a%2Fb%3D%3D"


def run_bench(module: str, *argv: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", module, "--upstream", "sim", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("BENCH "))
    return json.loads(line[len("BENCH ") :])


def test_the_kubelet_benchmark_delivers_every_write_to_its_kubelet_only() -> None:
    """Through the proxy, the upstream directly and the relay floor alike."""
    result = run_bench(
        "loadtest.bench.kubelets",
        "--kubelets",
        "6",
        "--spare-nodes",
        "2",
        "--pods-per-node",
        "2",
        "--configmaps",
        "6",
        "--rates",
        "20",
        "--window",
        "1",
        "--idle",
        "0.5",
        "--settle",
        "0.2",
        "--drain",
        "1",
        "--client-procs",
        "2",
        "--targets",
        "proxy,upstream,floor",
    )
    writes = [r for r in result["rows"] if r["phase"] == "write"]
    assert {(r["target"], r["select"]) for r in writes} == {
        (t, s) for t in ("proxy", "upstream", "floor") for s in ("watched", "unwatched")
    }
    for r in writes:
        assert r["written"] > 0
        assert (r["missing"], r["misrouted"], r["repeated"]) == (0, 0, 0)
        assert r["delivered"] == (r["written"] if r["select"] == "watched" else 0)
    idle = [r for r in result["rows"] if r["phase"] == "idle"]
    assert [r["established"] for r in idle] == [6 * 7] * 3


def test_the_relist_storm_lists_and_watches_from_the_warm_proxy_without_the_upstream() -> None:
    result = run_bench(
        "loadtest.bench.relist",
        "--informers",
        "8",
        "--pods",
        "30",
        "--targets",
        "proxy,upstream",
        "--client-procs",
        "2",
        "--settle",
        "0.2",
    )
    rows = {r["target"]: r for r in result["rows"]}
    assert rows["proxy"]["listed"] == rows["upstream"]["listed"] == 8
    assert rows["proxy"]["watching"] == 8
    assert rows["proxy"]["upstream_lists"] == 0


def test_the_consistent_reads_benchmark_writes_elsewhere_at_the_rate_from_its_own_process() -> None:
    """The writer (``busy_writer``) moves the upstream's rv at the rate asked, and the proxy still
    serves the quiet namespace's consistent LISTs from its cache: every sequential one, none passed.
    The same reads go direct once more (kube against itself), and each goal is judged for both."""
    result = run_bench(
        "loadtest.bench.consistent_reads",
        *("--configmaps", "5", "--leases", "10", "--rates", "0,40", "--reads", "20"),
        *("--concurrent", "4", "--concurrent-seconds", "0.5"),
    )
    quiet, busy = result["rates"]["0.0"], result["rates"]["40.0"]
    assert quiet["writes_per_s"] == 0
    assert 30 <= busy["writes_per_s"] <= 41, busy["writes_per_s"]
    assert busy["writer_cpu_us_per_write"] > 0
    for row in (quiet, busy):
        assert row["get-proxy"]["n"] == row["list-proxy"]["n"] == 20
        assert row["get-again"]["n"] == row["list-again"]["n"] == 20  # kube against itself, in the same rounds
        assert row["sequential"]["served"] == 20
        assert row["sequential"]["consistent-read"] == 0
        # The GETs passed through, sent to the upstream as they came (the worker idle between rounds).
        assert row["sequential"]["consistent-get"] == 20 and row["sequential"]["sent-early"] >= 10, row["sequential"][
            "sent-early"
        ]
        # Each goal, for the proxy and for kube again, worked out from the reads' own p50/p99.
        goals = {g["goal"]: g for g in row["goals"]}
        get_p50 = goals["GET p50 <= direct + 1 ms"]
        assert get_p50["again"] == round(row["get-again"]["p50"] - row["get-direct"]["p50"], 2)
        assert get_p50["again_met"] == (row["get-again"]["p50"] - row["get-direct"]["p50"] <= 1.0)
        list_p50 = goals["LIST p50 <= 2x direct"]
        assert list_p50["proxy"] == round(row["list-proxy"]["p50"] / row["list-direct"]["p50"], 2)
        assert list_p50["proxy_met"] == (row["list-proxy"]["p50"] <= 2 * row["list-direct"]["p50"])
        assert set(goals) == {"GET p50 <= direct + 1 ms", "GET p99 <= direct + 2 ms", "LIST p50 <= 2x direct",
                              "LIST p99 <= direct"}  # fmt: skip


def test_the_flood_helper_keeps_every_connection_busy_and_counts_answers_by_status() -> None:
    """The noisy neighbour's flood (``flood``) against the simulated cluster: 200s for a namespace's
    ConfigMaps, 401s for a token nobody knows; and a run after a run (a phase after a phase). The
    helper and the server each run in a session (a scheduling group) of their own, not the bench's."""
    import asyncio
    import os

    from loadtest.bench import lib as bl
    from loadtest.bench.kubecluster import sim_upstream

    files = bl.ProductionFiles(any_delegated=False, any_tls=True)
    up = sim_upstream(files)

    async def main() -> list[dict[str, Any]]:
        assert up.proc is not None and os.getsid(up.proc.pid) == up.proc.pid != os.getsid(0)
        flood = await bl.Helper.start("flood", "--connections", "4")
        try:
            await flood.recv(60)
            assert os.getsid(flood.pid) == flood.pid != os.getsid(0)
            out = []
            for token in (up.token, "nobody-knows-this-token"):
                run = {"url": up.url, "ca": "", "token": token, "path": "/api/v1/configmaps", "seconds": 0.5}
                assert await flood.ask("run", **run) == {"event": "started"}
                out.append(await flood.recv(60))
            return out
        finally:
            await flood.close()

    try:
        known, unknown = asyncio.run(main())
    finally:
        up.stop()
        files.cleanup()
    assert set(known["statuses"]) == {"200"} and known["statuses"]["200"] >= 4, known
    assert set(unknown["statuses"]) == {"401"} and unknown["statuses"]["401"] >= 4, unknown
    assert known["cpu"] > 0


def test_the_busy_writer_stops_when_it_has_no_connection_left() -> None:
    """Every connection lost (the upstream gone): ``stop`` still ends the run, not a wait for a free one."""
    import asyncio

    from loadtest.bench.busy_writer import Writer
    from loadtest.bench.kubeclient import Target

    async def main() -> float:
        writer = Writer(Target("https://127.0.0.1:1"), [], "leases", "ns", 10)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, stop.set)
        return await asyncio.wait_for(writer.run(100.0, stop), 5)

    assert asyncio.run(main()) < 5

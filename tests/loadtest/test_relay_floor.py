"""The relay floor (loadtest/bench/relay_floor.py) serves the kubelet clients: LIST, WATCH, one event to its node.

In-process, over a real socket, with the benchmark's own client (``kubeclient.H1Conn``); the
upstream side is fed lines as its stream reader would. The whole benchmark with the floor as a
target runs in test_kubeclient.py's smoke run.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from loadtest.bench.kubeclient import ACCEPT_PROTOBUF, Collect, FrameSplitter, Sink, Target, frame_stamp, list_meta
from loadtest.bench.relay_floor import Client, Expired, Relay
from tests.support.handlers import arun


class Stream(Sink):
    def __init__(self) -> None:
        self.splitter = FrameSplitter(protobuf=False)
        self.frames: list[bytes] = []
        self.opened = asyncio.get_running_loop().create_future()
        self.ended = asyncio.get_running_loop().create_future()

    def on_status(self, status: int, content_type: str) -> None:
        super().on_status(status, content_type)
        self.opened.set_result(status)

    def on_data(self, data: bytes) -> None:
        self.frames += self.splitter.feed(data)

    def on_end(self, error: str | None) -> None:
        self.ended.set_result(error)


def pod_event(node: str, rv: str, stamp: str) -> bytes:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": rv, "annotations": {"bench/written-at": stamp}},
        "spec": {"nodeName": node},
    }
    return orjson.dumps({"type": "MODIFIED", "object": obj})


@arun
async def test_a_pod_event_reaches_the_watch_of_its_node_only_and_lists_give_the_current_rv() -> None:
    relay = Relay()
    relay.rv, relay.ready = "100", True
    server = await asyncio.get_running_loop().create_server(lambda: Client(relay), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = Target(f"http://127.0.0.1:{port}")
    conns = [await target.connect() for _ in range(3)]
    try:
        listed = Collect()
        conns[0].request("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=500&resourceVersion=0",
                         listed, accept=ACCEPT_PROTOBUF)  # fmt: skip
        await listed.done
        assert listed.status == 200
        assert list_meta(listed.body, listed.content_type) == ("100", "")
        assert orjson.loads(listed.body)["kind"] == "PodList"

        streams = [Stream() for _ in conns]
        selectors = ["spec.nodeName%3Dn1", "spec.nodeName%3Dn2"]
        for conn, stream, sel in zip(conns[:2], streams[:2], selectors, strict=True):
            conn.request("GET", f"/api/v1/pods?fieldSelector={sel}&resourceVersion=100&watch=true", stream)
        conns[2].request(
            "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&watch=true&timeoutSeconds=1", streams[2]
        )
        assert [await s.opened for s in streams] == [200, 200, 200]
        await asyncio.sleep(0.05)  # the server has registered the watches

        relay.on_line(pod_event("n1", "101", "1.5"))
        relay.on_line(pod_event("n3", "102", "2.5"))  # nobody watches n3
        relay.on_line(b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"103"}}}')
        await asyncio.sleep(0.1)
        assert [frame_stamp(f) for f in streams[0].frames] == ["1.5"]
        assert streams[1].frames == streams[2].frames == []
        assert (relay.rv, relay.events, relay.sent) == ("103", 2, 1)

        assert await asyncio.wait_for(streams[2].ended, 5) is None  # timeoutSeconds ends the watch, not the connection
        again = Collect()
        conns[2].request("GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1", again)
        await again.done
        assert list_meta(again.body, again.content_type) == ("103", "")

        conns[0].close()
        await asyncio.sleep(0.05)
        assert set(relay.pods) == {"n2"}  # a closed connection's watch is gone
    finally:
        for conn in conns:
            conn.close()
        server.close()


def test_an_error_event_ends_the_upstream_stream() -> None:
    with pytest.raises(Expired):
        Relay().on_line(b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}')


class _Written:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)


@pytest.mark.parametrize("parse", ["orjson", "find"])
def test_either_parse_writes_the_line_as_one_chunk_to_the_watches_of_its_node(parse: str) -> None:
    relay = Relay(parse)
    clients = {}
    for node in ("n1", "n2"):
        client = Client(relay)
        client.transport = _Written()  # type: ignore[assignment]
        relay.register(node, client)
        clients[node] = client
    line = pod_event("n1", "7", "3.5")
    relay.on_line(line)
    relay.on_line(pod_event("n9", "8", "4.5"))
    assert clients["n1"].transport.data == [b"%x\r\n%b\n\r\n" % (len(line) + 1, line)]  # type: ignore[attr-defined]
    assert clients["n2"].transport.data == []  # type: ignore[attr-defined]
    assert (relay.events, relay.sent) == (2, 1)

"""Helper process: kubelet-shaped clients, many per process (``python -m loadtest.bench.kubelet_clients``).

Each kubelet ``i`` (node ``<prefix><i>``) runs what a kubelet's informers run:

* the pods bound to its node: ``/api/v1/pods?fieldSelector=spec.nodeName=<node>``;
* its own Node: ``/api/v1/nodes?fieldSelector=metadata.name=<node>``;
* ``--cm-per-kubelet`` ConfigMaps, one watch each: ``/api/v1/namespaces/<ns>/configmaps?
  fieldSelector=metadata.name=<cm>`` (the ones its pods mount: ``configmap_index``).

``--cert-dir``: each kubelet presents its own node's client certificate (``nodecerts``: user
``system:node:<node>``, group ``system:nodes``) instead of the bearer token, and first GETs its
Node (``/api/v1/nodes/<node>``, retried like a LIST), as a kubelet does at start.

Each watch is a client-go reflector: LIST (``resourceVersion=0&limit=500``), then WATCH from the
list's resourceVersion with bookmarks and ``timeoutSeconds`` in [T, 2T) (client-go: 5–10 min); a
watch that ends is resumed from the last resourceVersion seen, an ERROR (410) relists, a failed
request is retried after a backoff (0.8 s doubling to 30 s, as reflectors). ``Accept`` asks for
protobuf first, as a kubelet does (``--accept protobuf``): kube-apiserver answers protobuf, the
proxy JSON for full objects.

Over HTTP/1.1 each watch has its own TLS connection (a Go client does the same when the server
does not offer h2); ``--h2`` puts a kubelet's watches on one HTTP/2 connection, as client-go does.
``--source-addresses N`` spreads the kubelets over N loopback source addresses (127.0.1.1…);
the default, one, is what a server behind an address-rewriting load balancer sees.

Pod events carry the writer's ``bench/written-at`` stamp (``pod_writer``): while recording, each
received pod event is noted as (node, stamp, now − stamp), so the orchestrator finds missing,
misrouted and duplicate events and the delivery latency.

Commands (JSON lines): ``connect``, ``snap``, ``record-start {since}``, ``record-stop``, ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import time

from loadtest.bench import helperio
from loadtest.bench.kubeclient import (
    ACCEPT_JSON,
    ACCEPT_PROTOBUF,
    PROTOBUF,
    Collect,
    Conn,
    FrameSplitter,
    H1Conn,
    H2Conn,
    Sink,
    Target,
    add_target_flags,
    frame_stamp,
    frame_type,
    json_event_rv,
    list_meta,
    pb_event_rv,
    query,
)
from loadtest.bench.lib import raise_nofile


class State:
    def __init__(self) -> None:
        self.stopping = False
        self.events: collections.Counter[str] = collections.Counter()  # "<kind> <TYPE>"
        self.statuses: collections.Counter[str] = collections.Counter()  # failed requests: "LIST 429"
        self.open = 0  # watch streams open now
        self.opened = 0  # watch streams ever opened
        self.ended = 0  # watch streams that ended (any reason)
        self.ended_error: collections.Counter[str] = collections.Counter()
        self.relists = 0
        self.lists = 0
        self.reconnects = 0
        self.bytes = 0
        self.recording_since: float | None = None
        self.lat: list[float] = []
        self.stamps: dict[int, list[str]] = collections.defaultdict(list)
        self.errors: list[str] = []


CM_STRIDE = 5  # kubelet i's ConfigMaps start at i * CM_STRIDE: the ones its pods mount (kubecluster.seed)


def configmap_index(node: int, j: int, configmaps: int) -> int:
    """The ConfigMap the ``j``-th pod of node ``node`` mounts (and its kubelet watches)."""
    return (node * CM_STRIDE + j) % max(1, configmaps)


class Kubelet:
    """One node's watches and its identity; with HTTP/2 also their shared connection."""

    __slots__ = ("conn", "connecting", "gets", "index", "local", "name", "target", "watches")

    def __init__(self, index: int, name: str, local: str | None, target: Target) -> None:
        self.index = index
        self.name = name
        self.local = local
        self.target = target
        self.watches: list[Watch] = []
        self.gets: list[Watch] = []  # one-shot GETs at start (its Node), no watch after
        self.conn: H2Conn | None = None
        self.connecting: asyncio.Future[H2Conn] | None = None


class Watch(Sink):
    """One reflector: LIST, then WATCH; the sink of its watch stream."""

    __slots__ = ("conn", "kind", "kl", "list_path", "opened", "runner", "rv", "splitter", "streaming", "watch_base")

    def __init__(self, runner: Kubelets, kl: Kubelet, kind: str, collection: str, selector: str) -> None:
        self.runner = runner
        self.kl = kl
        self.kind = kind
        self.list_path = collection + query(fieldSelector=selector, limit=500, resourceVersion="0")
        self.watch_base = collection + query(allowWatchBookmarks=True, fieldSelector=selector)
        self.rv = ""
        self.conn: H1Conn | None = None
        self.splitter: FrameSplitter | None = None
        self.opened: asyncio.Future[bool] | None = None
        self.streaming = False

    def on_status(self, status: int, content_type: str) -> None:
        self.status = status
        self.content_type = content_type
        st = self.runner.st
        if status == 200:
            self.splitter = FrameSplitter(content_type.startswith(PROTOBUF))
            self.streaming = True
            st.open += 1
            st.opened += 1
            if self.opened is not None and not self.opened.done():
                self.opened.set_result(True)
        else:
            st.statuses[f"WATCH {status}"] += 1

    def on_data(self, data: bytes) -> None:
        st = self.runner.st
        st.bytes += len(data)
        splitter = self.splitter
        if not self.streaming or splitter is None:
            return
        kind = self.kind
        for frame in splitter.feed(data):
            t = frame_type(frame)
            st.events[kind + " " + t] += 1
            if t == "ERROR":
                self.rv = ""  # 410 Expired or another error: relist, as a reflector does
                st.relists += 1
                continue
            rv = pb_event_rv(frame) if splitter.protobuf else json_event_rv(frame)
            if rv:
                self.rv = rv
            if kind == "pod" and st.recording_since is not None and t != "BOOKMARK":
                stamp = frame_stamp(frame)
                if stamp is not None:
                    written = float(stamp)
                    if written >= st.recording_since:
                        st.lat.append(time.time() - written)
                        st.stamps[self.kl.index].append(stamp)

    def on_end(self, error: str | None) -> None:
        st = self.runner.st
        if self.conn is not None and self.conn.closed:
            self.conn = None
        if self.streaming:
            self.streaming = False
            st.open -= 1
            st.ended += 1
            if error is not None:
                st.ended_error[error] += 1
            if not st.stopping:
                self.runner.restart(self)
        elif self.opened is not None and not self.opened.done():
            self.opened.set_result(False)


class Kubelets:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.st = State()
        self.target = Target(args.target, args.token, args.ca, h2=args.h2)
        self.accept = ACCEPT_PROTOBUF if args.accept == "protobuf" else ACCEPT_JSON
        self.sem = asyncio.Semaphore(args.connect_concurrency)
        self.kubelets: list[Kubelet] = []
        self.tasks: set[asyncio.Task[bool]] = set()
        for i in range(args.lo, args.hi):
            local = f"127.0.1.{1 + i % args.source_addresses}" if args.source_addresses > 1 else None
            name = f"{args.node_prefix}{i:05d}"
            target = self.target
            if args.cert_dir:  # its own identity: a TLS context with its node's certificate
                cert = (f"{args.cert_dir}/{name}.crt", f"{args.cert_dir}/{name}.key")
                target = Target(args.target, "", args.ca, h2=args.h2, cert=cert)
            kl = Kubelet(i, name, local, target)
            if args.cert_dir:
                get = Watch(self, kl, "node-get", "/api/v1/nodes", "")
                get.list_path = f"/api/v1/nodes/{name}"
                kl.gets.append(get)
            kl.watches.append(Watch(self, kl, "pod", "/api/v1/pods", f"spec.nodeName={kl.name}"))
            kl.watches.append(Watch(self, kl, "node", "/api/v1/nodes", f"metadata.name={kl.name}"))
            for j in range(args.cm_per_kubelet):
                cm = f"{args.cm_prefix}{configmap_index(i, j, args.configmaps):05d}"
                kl.watches.append(
                    Watch(self, kl, "cm", f"/api/v1/namespaces/{args.namespace}/configmaps", f"metadata.name={cm}")
                )
            self.kubelets.append(kl)

    @property
    def watches(self) -> list[Watch]:
        return [w for kl in self.kubelets for w in kl.watches]

    # ------------------------------------------------------------------ connections

    async def _connect(self, kl: Kubelet) -> Conn:
        loop = asyncio.get_running_loop()
        t, local = kl.target, kl.local
        if t.h2:
            _, proto = await loop.create_connection(
                lambda: H2Conn(t), t.host, t.port, ssl=t.ssl, local_addr=(local, 0) if local else None
            )
            await proto.ready
            return proto
        _, proto1 = await loop.create_connection(
            lambda: H1Conn(t), t.host, t.port, ssl=t.ssl, local_addr=(local, 0) if local else None
        )
        return proto1

    async def conn_for(self, w: Watch) -> Conn:
        if not self.target.h2:
            if w.conn is None or w.conn.closed:
                async with self.sem:
                    conn = await self._connect(w.kl)
                assert isinstance(conn, H1Conn)
                w.conn = conn
            return w.conn
        kl = w.kl
        if kl.conn is not None and not kl.conn.closed:
            return kl.conn
        if kl.connecting is None:
            kl.connecting = asyncio.get_running_loop().create_future()
            try:
                async with self.sem:
                    conn = await self._connect(kl)
                kl.conn = conn  # type: ignore[assignment]
                kl.connecting.set_result(conn)  # type: ignore[arg-type]
            except BaseException as e:
                kl.connecting.set_exception(e)
                kl.connecting.exception()  # retrieved: others get it from await
                raise
            finally:
                fut, kl.connecting = kl.connecting, None
            return await fut
        return await kl.connecting

    # ------------------------------------------------------------------ one reflector

    async def run(self, w: Watch) -> bool:
        """LIST (unless resuming) and open the WATCH; retry with backoff until it is open."""
        st = self.st
        backoff = 0.8
        while not st.stopping:
            retry_after = 0.0
            try:
                conn = await self.conn_for(w)
                if not w.rv:
                    c = Collect(keep=1 << 16)
                    conn.request("GET", w.list_path, c, accept=self.accept)
                    await c.done
                    st.lists += 1
                    if c.error is not None:
                        raise ConnectionError(c.error)
                    if c.status != 200:
                        st.statuses[f"{'GET' if w.kind == 'node-get' else 'LIST'} {c.status}"] += 1
                        retry_after = 1.0 if c.status == 429 else 0.0
                        raise _Retry
                    if w.kind == "node-get":
                        if w.conn is not None:  # HTTP/1.1: its own connection, not needed any more
                            w.conn.close()
                        return True
                    w.rv, _ = list_meta(c.body, c.content_type)
                timeout = int(self.args.watch_timeout * (1 + random.random()))
                w.opened = asyncio.get_running_loop().create_future()
                conn.request(
                    "GET",
                    f"{w.watch_base}&resourceVersion={w.rv}&timeoutSeconds={timeout}&watch=true",
                    w,
                    accept=self.accept,
                )
                if await w.opened:
                    return True
                retry_after = 1.0 if w.status == 429 else 0.0
            except _Retry:
                pass
            except (OSError, ConnectionError, RuntimeError) as e:
                st.reconnects += 1
                if len(st.errors) < 20:
                    st.errors.append(f"{w.kind} {w.kl.name}: {type(e).__name__}: {e}")
            await asyncio.sleep(max(retry_after, backoff * (1 + random.random())))
            backoff = min(backoff * 2, 30.0)
        return False

    def restart(self, w: Watch) -> None:
        """The stream ended: resume it from the last resourceVersion seen (relist after an ERROR)."""
        task = asyncio.get_running_loop().create_task(self.run(w))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class _Retry(Exception):
    pass


async def main_async(args: argparse.Namespace) -> None:
    runner = Kubelets(args)
    st = runner.st
    async for cmd in helperio.commands():
        what = cmd["cmd"]
        if what == "connect":
            t0 = time.monotonic()
            watches = runner.watches
            gets = [g for kl in runner.kubelets for g in kl.gets]
            tasks = [asyncio.ensure_future(runner.run(w)) for w in watches]
            get_tasks = [asyncio.ensure_future(runner.run(g)) for g in gets]
            runner.tasks.update(tasks + get_tasks)
            for task in tasks + get_tasks:
                task.add_done_callback(runner.tasks.discard)
            # Watches still failing at the deadline keep retrying in the background (and are counted).
            done, _ = await asyncio.wait(tasks + get_tasks, timeout=float(cmd.get("deadline", 600)))
            helperio.emit(
                {
                    "event": "connected",
                    "kubelets": len(runner.kubelets),
                    "watches": len(watches),
                    "established": sum(
                        1 for t in tasks if t in done and not t.cancelled() and t.exception() is None and t.result()
                    ),
                    "gets": len(gets),
                    "gets_ok": sum(
                        1 for t in get_tasks if t in done and not t.cancelled() and t.exception() is None and t.result()
                    ),
                    "seconds": round(time.monotonic() - t0, 3),
                    "statuses": dict(st.statuses),
                    "errors": st.errors[:10],
                }
            )
        elif what == "snap":
            helperio.emit(
                {
                    "t": time.time(),
                    "cpu": helperio.rusage_cpu(),
                    "open": st.open,
                    "opened": st.opened,
                    "ended": st.ended,
                    "ended_error": dict(st.ended_error),
                    "relists": st.relists,
                    "lists": st.lists,
                    "reconnects": st.reconnects,
                    "bytes": st.bytes,
                    "events": dict(st.events),
                    "statuses": dict(st.statuses),
                }
            )
        elif what == "record-start":
            st.lat = []
            st.stamps = collections.defaultdict(list)
            st.recording_since = float(cmd["since"])
            # The nodes whose pod watch is open: the writes to the others cannot be delivered.
            watching = [kl.index for kl in runner.kubelets if kl.watches[0].streaming]
            helperio.emit({"ok": True, "watching": watching})
        elif what == "record-stop":
            st.recording_since = None
            helperio.emit({"lat": st.lat, "stamps": {str(k): v for k, v in st.stamps.items()}})
            st.lat = []
            st.stamps = collections.defaultdict(list)
    st.stopping = True
    for kl in runner.kubelets:
        if kl.conn is not None:
            kl.conn.close()
        for w in kl.watches:
            if w.conn is not None:
                with contextlib.suppress(Exception):
                    w.conn.close()
    await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    import uvloop

    raise_nofile()
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_target_flags(p)
    p.add_argument("--h2", action="store_true", help="one HTTP/2 connection per kubelet")
    p.add_argument("--accept", choices=("protobuf", "json"), default="protobuf")
    p.add_argument("--lo", type=int, required=True, help="first node index")
    p.add_argument("--hi", type=int, required=True, help="last node index + 1")
    p.add_argument("--node-prefix", required=True)
    p.add_argument("--namespace", required=True, help="namespace of the ConfigMaps")
    p.add_argument("--cm-prefix", required=True)
    p.add_argument("--configmaps", type=int, required=True, help="ConfigMaps that exist (<cm-prefix>00000…)")
    p.add_argument("--cm-per-kubelet", type=int, default=5)
    p.add_argument("--watch-timeout", type=float, default=300.0, help="timeoutSeconds in [T, 2T) (client-go: 300)")
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--source-addresses", type=int, default=1)
    p.add_argument(
        "--cert-dir", default="", help="each kubelet presents <dir>/<node>.crt and .key (nodecerts), no token"
    )
    args = p.parse_args(argv)
    uvloop.run(main_async(args))


if __name__ == "__main__":
    main()

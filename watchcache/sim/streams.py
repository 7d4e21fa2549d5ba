"""``pods/exec``, ``pods/attach`` and ``pods/portforward`` of the simulated cluster, over WebSocket.

What a kubelet's streaming server speaks, behind kube-apiserver:

- exec and attach: kube's channel protocol (``v5.channel.k8s.io``, ``v4.channel.k8s.io``, and
  the legacy ``channel.k8s.io``): the first byte of each binary message is the stream — 0
  stdin, 1 stdout, 2 stderr, 3 error (v4/v5: a Status JSON, ``Success`` or a
  ``NonZeroExitCode`` failure carrying the exit code), 4 resize; in v5 the client's
  ``[255, n]`` closes its stream n (stdin's end). Commands: ``watchcache.sim.commands``.
- port-forward: ``v4.channel.k8s.io`` as the official Python client uses it: per requested
  port a data channel (2i) and an error channel (2i+1), each opened by a message holding the
  port (uint16, little-endian); data is relayed to that port on 127.0.0.1 (the simulated
  pod's address is the simulator's own loopback).

SPDY (kubectl's port-forward, and its exec fallback) is not implemented: such requests get a
400 Status saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

import orjson

from watchcache import apierrors
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.server.options import parse_bool
from watchcache.sim.commands import NotFound, PodFiles, Process, run
from watchcache.sim.websocket import WebSocket, choose_subprotocol

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
EXEC_PROTOCOLS = [V5, V4, "channel.k8s.io", ""]
PORTFORWARD_PROTOCOLS = [V4, ""]
SUBRESOURCES = frozenset({"exec", "attach", "portforward"})


def _bool(request: Request, name: str) -> bool:
    value = request.query_value(name)
    try:
        return value is not None and parse_bool(value)
    except apierrors.StatusError:
        return False


def container_name(pod: dict[str, Any], name: str | None) -> str:
    """kube-apiserver's validateContainer."""
    names = [c.get("name", "") for c in pod.get("spec", {}).get("containers", [])]
    pod_name = pod.get("metadata", {}).get("name", "")
    if not name:
        if len(names) == 1:
            return names[0]
        if not names:
            raise apierrors.bad_request(f"a container name must be specified for pod {pod_name}")
        raise apierrors.bad_request(
            f"a container name must be specified for pod {pod_name}, choose one of: [{' '.join(names)}]"
        )
    if name not in names:
        raise apierrors.bad_request(f"container {name} is not valid for pod {pod_name}")
    return name


async def serve(files: PodFiles, request: Request, response: Response, info: RequestInfo, pod: dict[str, Any]) -> None:
    """Validate as kube-apiserver does, then run the session until it ends."""
    meta = pod.get("metadata", {})
    if info.subresource != "portforward":
        container_name(pod, request.query_value("container"))
    if not pod.get("spec", {}).get("nodeName"):
        raise apierrors.bad_request(f"pod {meta.get('name')} does not have a host assigned")
    if request.upgrade is None:
        raise apierrors.bad_request("Upgrade request required")
    if request.upgrade.strip().lower() != "websocket":
        raise apierrors.bad_request(
            f"the simulated cluster serves {info.subresource} over WebSocket only, not {request.upgrade}"
        )
    if info.subresource == "portforward":
        await _portforward(request, response, meta)
    else:
        await _exec(files, request, response, info, meta)


# ---------------------------------------------------------------- exec and attach


async def _exec(files: PodFiles, request: Request, response: Response, info: RequestInfo, meta: dict) -> None:
    stdin, stdout, stderr = (_bool(request, n) for n in ("stdin", "stdout", "stderr"))
    tty = _bool(request, "tty")
    command = request.query.get("command", [])
    if info.subresource == "exec" and not command:
        raise apierrors.bad_request("you must specify at least one command for the container")
    if not (stdin or stdout or stderr):
        raise apierrors.bad_request("you must specify at least 1 of stdin, stdout, stderr")
    protocol = choose_subprotocol(request, EXEC_PROTOCOLS)
    ws = WebSocket.accept(request, response, protocol)
    session = _ExecSession(ws, protocol, stdin)
    # Tell the client the streams are up: an empty message on the lowest writable channel.
    await session.write(STDOUT if stdout else STDERR if stderr else ERROR, b"", force=True)
    reader = asyncio.ensure_future(session.read_loop())
    out = STDOUT if stdout else None
    err = (STDOUT if tty else STDERR) if stderr or tty else None
    proc = Process(
        meta.get("namespace", ""),
        meta.get("name", ""),
        files,
        session.read_stdin,
        lambda data: session.write(out, data),
        lambda data: session.write(err, data),
    )
    work = asyncio.ensure_future(_attach(proc, stdin) if info.subresource == "attach" else run(command, proc))
    try:
        # The command ends (its status is the session's last message), or the client leaves (it is stopped).
        await asyncio.wait([work, reader], return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            try:
                await session.status(work.result())
            except NotFound as e:
                message = f'exec: "{e}": executable file not found in $PATH'
                await session.status(-1, f"Internal error occurred: error executing command in container: {message}")
    except ConnectionClosed:
        pass
    finally:
        for task in (work, reader):
            task.cancel()
        await asyncio.gather(work, reader, return_exceptions=True)
        ws.close()


async def _attach(proc: Process, stdin: bool) -> int:
    """The container's main process: with stdin it echoes it (a `cat`), else it prints a line and waits."""
    if stdin:
        while (chunk := await proc.read_stdin()) is not None:
            await proc.write_stdout(chunk)
        return 0
    await proc.write_stdout(f"attached to {proc.namespace}/{proc.pod}\n".encode())
    await asyncio.Event().wait()  # until the client leaves (the session is cancelled)
    return 0


class _ExecSession:
    def __init__(self, ws: WebSocket, protocol: str, stdin: bool) -> None:
        self.ws = ws
        self.protocol = protocol
        self.stdin: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
        self.stdin_open = stdin
        self.resizes: list[dict[str, Any]] = []

    async def write(self, channel: int | None, data: bytes, force: bool = False) -> None:
        if channel is None or (not data and not force):
            return
        await self.ws.send(bytes((channel,)) + data)

    async def read_stdin(self) -> bytes | None:
        if not self.stdin_open and self.stdin.empty():
            return None
        data = await self.stdin.get()
        if data is None:
            self.stdin_open = False
        return data

    async def read_loop(self) -> None:
        while (message := await self.ws.receive()) is not None:
            if not message:
                continue
            channel, data = message[0], message[1:]
            if channel == STDIN and data:
                await self.stdin.put(data)  # bounded: reading pauses while the command is slow
            elif channel == CLOSE and self.protocol == V5 and data[:1] == bytes((STDIN,)):
                await self.stdin.put(None)
            elif channel == RESIZE:
                with contextlib.suppress(orjson.JSONDecodeError):
                    self.resizes.append(orjson.loads(data))
        # The client left: end of input (never blocking, so that this task ends now).
        with contextlib.suppress(asyncio.QueueFull):
            self.stdin.put_nowait(None)

    async def status(self, code: int, internal: str | None = None) -> None:
        """The error channel's last word: v4/v5 a Status, the legacy protocols a message on failure."""
        if internal is not None:
            status: dict[str, Any] = {
                "metadata": {},
                "status": "Failure",
                "message": internal,
                "reason": "InternalError",
                "code": 500,
            }
        elif code == 0:
            status = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        if self.protocol in (V5, V4):
            await self.write(ERROR, orjson.dumps(status))
        elif status["status"] == "Failure":
            await self.write(ERROR, status["message"].encode())


# ---------------------------------------------------------------- port-forward


def _ports(request: Request) -> list[int]:
    """kube's NewV4Options: ``ports`` repeated or comma-separated, each 1..65535."""
    ports: list[int] = []
    values = request.query.get("ports", [])
    if not values:
        raise apierrors.bad_request('query parameter "port" is required')
    for value in values:
        for text in value.split(","):
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise apierrors.bad_request(f'unable to parse "{value}" as a port')
            ports.append(int(text))
    return ports


async def _portforward(request: Request, response: Response, meta: dict) -> None:
    ports = _ports(request)
    protocol = choose_subprotocol(request, PORTFORWARD_PROTOCOLS)
    ws = WebSocket.accept(request, response, protocol)
    forwards = [_Forward(ws, i, port, meta) for i, port in enumerate(ports)]
    tasks: list[asyncio.Future[None]] = []
    try:
        for f in forwards:
            prefix = struct.pack("<H", f.port)
            await ws.send(bytes((f.data,)) + prefix)
            await ws.send(bytes((f.error,)) + prefix)
        tasks = [asyncio.ensure_future(f.run()) for f in forwards]
        ports_done: asyncio.Future[list[None]] = asyncio.gather(*tasks)
        reader = asyncio.ensure_future(_route(ws, forwards))
        tasks.append(reader)
        # The session ends when every port's connection has ended, or when the client leaves.
        either: list[asyncio.Future[Any]] = [ports_done, reader]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except ConnectionClosed:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for f in forwards:
            f.close()
        ws.close()


async def _route(ws: WebSocket, forwards: list[_Forward]) -> None:
    by_channel = {f.data: f for f in forwards}
    while (message := await ws.receive()) is not None:
        forward = by_channel.get(message[0]) if message else None
        if forward is not None and len(message) > 1:
            await forward.to_port(message[1:])


class _Forward:
    """One forwarded port: a TCP connection to 127.0.0.1:port, relayed on a data channel."""

    def __init__(self, ws: WebSocket, index: int, port: int, meta: dict) -> None:
        self.ws = ws
        self.port = port
        self.data, self.error = 2 * index, 2 * index + 1
        self.meta = meta
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()

    async def run(self) -> None:
        try:
            reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as e:
            self.connected.set()
            name, uid = self.meta.get("name"), self.meta.get("uid")
            why = (e.strerror or str(e)).lower()
            dial = f"dial tcp 127.0.0.1:{self.port}: connect: {why}"  # as Go words it
            message = f"error forwarding port {self.port} to pod {name}, uid {uid}: {dial}"
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(bytes((self.error,)) + message.encode())
            return
        self.connected.set()
        with contextlib.suppress(ConnectionClosed, OSError):
            while data := await reader.read(65536):
                await self.ws.send(bytes((self.data,)) + data)

    async def to_port(self, data: bytes) -> None:
        await self.connected.wait()
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(data)
            with contextlib.suppress(OSError):  # the port's connection ended: the bytes go nowhere
                await self.writer.drain()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

"""The memory floor under an idle TLS watch: what one TLS connection costs before any HTTP code.

Measured because the proxy's RSS per idle HTTP/1.1 watch (``loadtest.bench.kubelets``, one TLS
connection per watch) is mostly TLS state. Three figures, each as RSS growth per connection:

* ``bare``: a uvloop server whose protocol does nothing, with ``N`` idle connections from a client
  process (``--transport tls``; ``plain`` for TCP alone; ``asyncio-tls`` for the stdlib's TLS,
  whose 256 KiB read buffer is a zero-filled ``bytearray``, so all of it resident);
* ``openssl``: in one process, ``N`` server-side ``ssl.SSLObject`` after their handshake, on memory
  BIOs (the client side dropped): OpenSSL's own state per connection, malloc'd and resident, with
  ``SSL_MODE_RELEASE_BUFFERS`` as CPython sets it, and without it (``--keep-buffers``);
* the difference is uvloop's per-connection TLS objects and its 256 KiB read buffer (malloc'd;
  only the pages a read touched are resident).

Run: ``.venv/bin/python -m loadtest.bench.tls_floor [-n 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.bench import lib as bl

REQUEST = (
    b"GET /api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dnode-00001 HTTP/1.1\r\nHost: x\r\n"
    b"Authorization: Bearer 0123456789abcdef0123456789abcdef\r\nAccept: application/vnd.kubernetes.protobuf\r\n\r\n"
)


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class _Mallinfo(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keep")
    ]


def malloced_kb() -> float:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo
    m = libc.mallinfo2()
    return float(m.uordblks + m.hblkhd) / 1024


def _server(cert: str, key: str, transport: str) -> None:
    """Child: accept connections, read their request, answer a chunked head, keep them idle."""

    class Idle(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t: Any = t

        def data_received(self, data: bytes) -> None:
            self.t.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    async def main() -> None:
        ctx = None
        if transport != "plain":
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
        srv = await asyncio.get_running_loop().create_server(Idle, "127.0.0.1", 0, ssl=ctx, backlog=4096)
        print(srv.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(3600)

    if transport == "asyncio-tls":
        asyncio.run(main())
    else:
        import uvloop

        uvloop.run(main())


def bare(n: int, transport: str, cert: tuple[Path, Path]) -> dict[str, Any]:
    env, cwd = bl.child_env()
    child = subprocess.Popen(
        bl.python_m("loadtest.bench.tls_floor", "--serve", transport, str(cert[0]), str(cert[1])),
        stdout=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        time.sleep(0.5)
        before = rss_kb(child.pid)

        async def connect() -> float:
            ctx = None
            if transport != "plain":
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            sem = asyncio.Semaphore(50)
            conns: list[Any] = []

            async def one() -> None:
                async with sem:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
                    writer.write(REQUEST)
                    await reader.readuntil(b"\r\n\r\n")
                    conns.append(writer)

            await asyncio.gather(*(one() for _ in range(n)))
            await asyncio.sleep(1.0)
            after = rss_kb(child.pid)
            for w in conns:
                w.close()
            return (after - before) / n

        import uvloop

        per = uvloop.run(connect())
        return {"what": f"bare {transport} server", "connections": n, "kb_per_connection": round(per, 1)}
    finally:
        child.kill()
        child.wait()


def openssl(n: int, cert: tuple[Path, Path], keep_buffers: bool) -> dict[str, Any]:
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if keep_buffers:
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        lib.SSL_CTX_ctrl.restype = ctypes.c_long
        lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        # The SSL_CTX* follows the object head in CPython's PySSLContext; SSL_CTRL_CLEAR_MODE (78).
        lib.SSL_CTX_ctrl(ctypes.c_void_p.from_address(id(sctx) + 16).value, 78, 0x10, None)
    cctx = ssl.create_default_context()
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE

    def pair() -> tuple[Any, ...]:
        si, so, ci, co = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        s, c = sctx.wrap_bio(si, so, server_side=True), cctx.wrap_bio(ci, co)
        for _ in range(10):
            for obj in (c, s):
                with contextlib.suppress(ssl.SSLWantReadError):
                    obj.do_handshake()
            si.write(co.read())
            ci.write(so.read())
        c.write(REQUEST)
        si.write(co.read())
        s.read(65536)
        s.write(b"HTTP/1.1 200 OK\r\n\r\n")
        ci.write(so.read())
        return s, si, so

    pair()
    gc.collect()
    r0, m0 = rss_kb(), malloced_kb()
    kept = [pair() for _ in range(n)]
    gc.collect()
    r1, m1 = rss_kb(), malloced_kb()
    assert len(kept) == n
    return {
        "what": "OpenSSL server connection" + (" without SSL_MODE_RELEASE_BUFFERS" if keep_buffers else ""),
        "connections": n,
        "openssl": ssl.OPENSSL_VERSION,
        "kb_per_connection": round((r1 - r0) / n, 1),
        "malloced_kb_per_connection": round((m1 - m0) / n, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2000, help="connections")
    p.add_argument("--serve", nargs=3, metavar=("TRANSPORT", "CERT", "KEY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        _server(args.serve[1], args.serve[2], args.serve[0])
        return
    bl.raise_nofile()
    with tempfile.TemporaryDirectory(prefix="tls-floor-") as d:
        cert = bl.make_tls_cert(Path(d))
        rows = [bare(args.n, t, cert) for t in ("plain", "tls", "asyncio-tls")]
        rows += [openssl(args.n, cert, keep) for keep in (False, True)]
    for row in rows:
        bl.log(json.dumps(row))
    print("BENCH " + json.dumps({"bench": "tls_floor", "machine": bl.machine_info(), "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1:])

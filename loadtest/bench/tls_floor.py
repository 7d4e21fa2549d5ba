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

Run: ``.venv/bin/python -m loadtest.bench.tls_floor [-n 2000]``; ``--variants``: the ``openssl`` row under
the product's serving context and settings one might try on it (tickets, the session cache).
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
        preexec_fn=bl.child_preexec(),
        start_new_session=True,  # a scheduling group of its own, as ``bl.Proc`` starts the proxy
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


def _ssl_ctx_ctrl(ctx: ssl.SSLContext, cmd: int, larg: int) -> int:
    """``SSL_CTX_ctrl`` on ``ctx`` (settings the ``ssl`` module does not expose)."""
    import _ssl

    lib = ctypes.CDLL(_ssl.__file__)
    lib.SSL_CTX_ctrl.restype = ctypes.c_long
    lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    # The SSL_CTX* follows the object head in CPython's PySSLContext.
    return int(lib.SSL_CTX_ctrl(ctypes.c_void_p.from_address(id(ctx) + 16).value, cmd, larg, None))


_SET_SESS_CACHE_MODE, _SESS_NUMBER, _CLEAR_MODE = 44, 20, 78


def _product_context(cert: tuple[Path, Path]) -> ssl.SSLContext:
    """The serving context as ``watchcache.http.tls.ServingCert`` makes it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def _no_ticket(ctx: ssl.SSLContext) -> None:
    ctx.options |= ssl.OP_NO_TICKET


def _no_tickets_sent(ctx: ssl.SSLContext) -> None:
    ctx.num_tickets = 0


def _session_cache_off(ctx: ssl.SSLContext) -> None:
    _ssl_ctx_ctrl(ctx, _SET_SESS_CACHE_MODE, 0)


#: Server-context settings tried against the product's context (``--variants``).
VARIANTS = {
    "product": None,
    "num_tickets=0": _no_tickets_sent,
    "session cache off": _session_cache_off,
    "OP_NO_TICKET": _no_ticket,
}


def openssl(
    n: int,
    cert: tuple[Path, Path],
    keep_buffers: bool,
    *,
    variant: str = "",
    client_max: ssl.TLSVersion | None = None,
) -> dict[str, Any]:
    """``variant``: the product's serving context with one of :data:`VARIANTS` (else the stdlib's default
    server context, as the rows without ``--variants``); ``client_max``: cap the client's TLS version."""
    if variant:
        sctx = _product_context(cert)
        configure = VARIANTS[variant]
        if configure is not None:
            configure(sctx)
    else:
        sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        sctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if keep_buffers:
        _ssl_ctx_ctrl(sctx, _CLEAR_MODE, 0x10)  # SSL_MODE_RELEASE_BUFFERS
    cctx = ssl.create_default_context()
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    if client_max is not None:
        cctx.maximum_version = client_max

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
    row = {
        "what": "OpenSSL server connection" + (" without SSL_MODE_RELEASE_BUFFERS" if keep_buffers else ""),
        "connections": n,
        "openssl": ssl.OPENSSL_VERSION,
        "kb_per_connection": round((r1 - r0) / n, 1),
        "malloced_kb_per_connection": round((m1 - m0) / n, 1),
    }
    if variant:
        # Rows run one after another in this process reuse what the previous rows freed: RSS growth
        # is not comparable between them, malloc'd bytes are.
        del row["kb_per_connection"]
        row.update(
            what=f"OpenSSL server connection, product context: {variant}",
            version=kept[0][0].version(),
            sessions_cached=_ssl_ctx_ctrl(sctx, _SESS_NUMBER, 0),
        )
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2000, help="connections")
    p.add_argument("--serve", nargs=3, metavar=("TRANSPORT", "CERT", "KEY"), help=argparse.SUPPRESS)
    p.add_argument(
        "--variants",
        action="store_true",
        help="instead: OpenSSL's state per connection under the product's serving context and each server "
        "setting of VARIANTS, with TLS 1.3 and TLS 1.2 clients",
    )
    args = p.parse_args(argv)
    if args.serve:
        _server(args.serve[1], args.serve[2], args.serve[0])
        return
    bl.raise_nofile()
    with tempfile.TemporaryDirectory(prefix="tls-floor-") as d:
        cert = bl.make_tls_cert(Path(d))
        if args.variants:
            rows = [
                openssl(args.n, cert, False, variant=v, client_max=top)
                for top in (None, ssl.TLSVersion.TLSv1_2)
                for v in VARIANTS
            ]
        else:
            rows = [bare(args.n, t, cert) for t in ("plain", "tls", "asyncio-tls")]
            rows += [openssl(args.n, cert, keep) for keep in (False, True)]
    for row in rows:
        bl.log(json.dumps(row))
    print("BENCH " + json.dumps({"bench": "tls_floor", "machine": bl.machine_info(), "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Smoke run of loadtest/bench/tls_floor.py (a few connections): every row measured, TLS above TCP."""

from __future__ import annotations

from typing import Any

from tests.loadtest.benchrun import bench_json


def bench_rows(*args: str) -> list[dict[str, Any]]:
    """The rows of one ``tls_floor`` run with ``args`` (40 connections)."""
    rows: list[dict[str, Any]] = bench_json("tls_floor", "-n", "40", *args)["rows"]
    return rows


def test_tls_floor_measures_every_row() -> None:
    rows = {r["what"]: r for r in bench_rows()}
    assert len(rows) == 5
    # OpenSSL's own state of a connection after its handshake is kilobytes, more without released buffers.
    kept = rows["OpenSSL server connection without SSL_MODE_RELEASE_BUFFERS"]["malloced_kb_per_connection"]
    assert 1 < rows["OpenSSL server connection"]["malloced_kb_per_connection"] < kept


def test_tls_floor_variants_measure_each_server_setting_with_both_client_versions() -> None:
    rows = bench_rows("--variants")
    assert {(r["what"].rsplit(": ", 1)[1], r["version"]) for r in rows} == {
        (v, tls)
        for v in ("product", "num_tickets=0", "session cache off", "OP_NO_TICKET")
        for tls in ("TLSv1.3", "TLSv1.2")
    }
    cached = {(r["what"].rsplit(": ", 1)[1], r["version"]): r["sessions_cached"] for r in rows}
    # Tickets leave the server's session cache empty; without them it keeps every session.
    assert cached[("product", "TLSv1.3")] == 0 and cached[("OP_NO_TICKET", "TLSv1.2")] >= 40

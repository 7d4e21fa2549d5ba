"""Issue 34 item 3: a serving certificate that cannot be read at start stops the start; one that cannot be
reloaded later keeps the previous one serving and is warned about once per change, not every tick."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from harness.pki import Pair
from watchcache.http.tls import ServingCert, TlsOptions

LOGGER = "watchcache.http.tls"


def copy_pair(pair: Pair, d: Path) -> Pair:
    out = Pair(d / "tls.crt", d / "tls.key")
    shutil.copy(pair.crt, out.crt)
    shutil.copy(pair.key, out.key)
    return out


def touch_later(path: Path, seconds: float) -> None:
    """A new mtime, as a rotation gives (without sleeping for the clock)."""
    stat = path.stat()
    os.utime(path, (stat.st_atime + seconds, stat.st_mtime + seconds))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("missing", ["crt", "key"])
def test_a_pair_that_cannot_be_read_at_start_is_an_error_naming_the_flags(
    serving_cert: tuple[Pair, Pair], tmp_path: Path, missing: str
) -> None:
    pair = copy_pair(serving_cert[1], tmp_path)
    getattr(pair, missing).unlink()
    with pytest.raises(ValueError, match=r"--tls-cert-file .*tls.crt, --tls-private-key-file .*tls.key: No such file"):
        TlsOptions(str(pair.crt), str(pair.key)).check()


def test_a_key_that_does_not_match_at_start_is_an_error(serving_cert: tuple[Pair, Pair], tmp_path: Path) -> None:
    ca, server = serving_cert
    with pytest.raises(ValueError, match="not a matching PEM certificate and key"):
        TlsOptions(str(server.crt), str(ca.key)).check()


def test_an_unreadable_client_ca_names_its_flag(serving_cert: tuple[Pair, Pair], tmp_path: Path) -> None:
    server = serving_cert[1]
    with pytest.raises(ValueError, match=r"--client-ca-file .*absent.crt: No such file or directory"):
        TlsOptions(str(server.crt), str(server.key), str(tmp_path / "absent.crt")).check()


def test_a_missing_file_later_keeps_the_old_certificate_and_warns_once(
    serving_cert: tuple[Pair, Pair], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pair = copy_pair(serving_cert[1], tmp_path)
    cert = ServingCert(str(pair.crt), str(pair.key))
    context = cert.context
    caplog.set_level(logging.INFO, LOGGER)
    pair.crt.unlink()
    for _ in range(10):  # ten ticks of the process
        assert not cert.reload_if_changed()
    assert len(warnings(caplog)) == 1, warnings(caplog)
    assert "keeping the previous serving certificate" in warnings(caplog)[0]
    assert "No such file or directory" in warnings(caplog)[0]
    assert cert.context is context  # the old pair goes on serving

    shutil.copy(serving_cert[1].crt, pair.crt)
    touch_later(pair.crt, 5)
    assert cert.reload_if_changed()
    assert any("serving certificate reloaded" in r.getMessage() for r in caplog.records)
    assert len(warnings(caplog)) == 1


def test_each_bad_rotation_is_warned_about_once(
    serving_cert: tuple[Pair, Pair], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, server = serving_cert
    pair = copy_pair(server, tmp_path)
    cert = ServingCert(str(pair.crt), str(pair.key))
    caplog.set_level(logging.INFO, LOGGER)
    shutil.copy(ca.key, pair.key)  # a key that does not match the certificate
    touch_later(pair.key, 5)
    for _ in range(5):
        assert not cert.reload_if_changed()
    assert len(warnings(caplog)) == 1
    assert "not a matching PEM certificate and key" in warnings(caplog)[0]
    touch_later(pair.key, 10)  # rotated again, as wrong: a new change, a new warning
    for _ in range(5):
        assert not cert.reload_if_changed()
    assert len(warnings(caplog)) == 2

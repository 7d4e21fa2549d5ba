"""Certificates for end-to-end tests, made with the openssl command line (short-lived, RSA 2048)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Pair:
    crt: Path
    key: Path


class Pki:
    """CAs and the certificates they sign, as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ca(self, name: str, subject: str) -> Pair:
        pair = Pair(self.root / f"{name}.crt", self.root / f"{name}.key")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pair.key), "-out", str(pair.crt),
                "-days", "1", "-subj", subject)  # fmt: skip
        return pair

    def issue(self, ca: Pair, name: str, subject: str, *, ip_san: str | None = None) -> Pair:
        pair = Pair(self.root / f"{name}.crt", self.root / f"{name}.key")
        csr = self.root / f"{name}.csr"
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pair.key), "-out", str(csr), "-subj", subject)
        ext: list[str] = []
        if ip_san:
            ext_file = self.root / f"{name}.ext"
            ext_file.write_text(f"subjectAltName=IP:{ip_san}\n")
            ext = ["-extfile", str(ext_file)]
        openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.crt), "-CAkey", str(ca.key), "-CAcreateserial",
                "-out", str(pair.crt), "-days", "1", *ext)  # fmt: skip
        return pair


def make_pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN=alice, O=team-a)."""
    names = ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt", "cli.key", "cli.csr", "cli.crt", "ext")
    p = {n: d / n for n in names}
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(p["ca.key"]), "-out", str(p["ca.crt"]),
            "-days", "1", "-subj", "/CN=test-ca")  # fmt: skip
    p["ext"].write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subj, ext in (("srv", "/CN=127.0.0.1", ["-extfile", str(p["ext"])]), ("cli", "/CN=alice/O=team-a", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(p[f"{who}.key"]), "-out", str(p[f"{who}.csr"]),
                "-subj", subj)  # fmt: skip
        openssl("x509", "-req", "-in", str(p[f"{who}.csr"]), "-CA", str(p["ca.crt"]), "-CAkey", str(p["ca.key"]),
                "-CAcreateserial", "-out", str(p[f"{who}.crt"]), "-days", "1", *ext)  # fmt: skip
    return p

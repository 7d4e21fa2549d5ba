"""Node client certificates for simulated kubelets, issued once by the kit's CA and cached on disk.

A kubelet authenticates as user ``system:node:<name>`` in group ``system:nodes`` with a client
certificate the cluster's CA signed (``CN=system:node:<name>``, ``O=system:nodes``); kube's Node
authorizer and flow control (FlowSchemas ``system-nodes`` and ``system-node-high``) key on that
identity. One certificate per node: an ECDSA P-256 key (cheap to make and to handshake with) and a
certificate valid 30 days, made by one ``openssl req -x509 -CA`` per node (about 30 ms), ``procs``
at a time. They live in ``~/.cache/watchcache-bench/node-certs/<CA fingerprint>/`` (``$XDG_CACHE_HOME``
respected), so 5,000 nodes cost a couple of minutes once and nothing on the next run; a certificate
older than 20 days is issued again.

Run ahead of a measurement (so that issuing is not in it)::

    python -m loadtest.bench.nodecerts --ca-cert ~/.cache/kube-reference/pki/ca.crt \\
        --ca-key ~/.cache/kube-reference/pki/ca.key --prefix nodeburst-node- --count 5000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest.bench.kubelet_clients import CM_STRIDE

VALID_DAYS = 30
REISSUE_AFTER_S = 20 * 86400.0

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
"""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "watchcache-bench" / "node-certs"


def cert_dir(ca_cert: Path, root: Path | None = None) -> Path:
    """The directory of the certificates ``ca_cert`` signs (one per CA: a rebuilt kit gets new ones)."""
    digest = hashlib.sha256(ca_cert.read_bytes()).hexdigest()[:16]
    return (root or cache_root()) / digest


def pair(directory: Path, node: str) -> tuple[Path, Path]:
    """(certificate, key) of ``node`` in ``directory``."""
    return directory / f"{node}.crt", directory / f"{node}.key"


def _fresh(crt: Path, now: float) -> bool:
    try:
        return now - crt.stat().st_mtime < REISSUE_AFTER_S
    except OSError:
        return False


def _issue(directory: Path, config: Path, ca_cert: Path, ca_key: Path, node: str) -> None:
    crt, key = pair(directory, node)
    # Written under temporary names and renamed, the certificate last: its presence means complete.
    tmp_crt, tmp_key = crt.with_suffix(".crt.tmp"), key.with_suffix(".key.tmp")
    subprocess.run(
        ["openssl", "req", "-new", "-x509", "-config", str(config), "-extensions", "client",
         "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(tmp_key), "-out", str(tmp_crt), "-subj", f"/O=system:nodes/CN=system:node:{node}",
         "-CA", str(ca_cert), "-CAkey", str(ca_key), "-days", str(VALID_DAYS)],
        check=True, capture_output=True,
    )  # fmt: skip
    tmp_key.chmod(0o600)
    tmp_key.rename(key)
    tmp_crt.rename(crt)


def ensure(nodes: Sequence[str], ca_cert: Path, ca_key: Path, *, procs: int = 2, root: Path | None = None) -> Path:
    """Issue the certificates of ``nodes`` that are missing or old; return their directory."""
    directory = cert_dir(ca_cert, root)
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    todo = [n for n in nodes if not _fresh(pair(directory, n)[0], now)]
    if not todo:
        return directory
    with tempfile.TemporaryDirectory(prefix="nodecerts-") as tmp:
        config = Path(tmp) / "openssl.cnf"
        config.write_text(_OPENSSL_CONFIG)
        with concurrent.futures.ThreadPoolExecutor(max(1, procs)) as pool:
            for f in [pool.submit(_issue, directory, config, ca_cert, ca_key, n) for n in todo]:
                f.result()
    return directory


# ---------------------------------------------------------------- the kubelet benchmark's use of them

FLOW_SCHEMAS = ("system-nodes", "system-node-high")  # what node identities are classified as (kube's suggested)


def kit_home() -> Path:
    return Path(os.environ.get("KUBE_REFERENCE_HOME", str(Path.home() / ".cache/kube-reference")))


def ensure_kit(nodes: Sequence[str]) -> Path:
    """The certificates of ``nodes`` signed by the reference kit's CA (which kube-apiserver trusts)."""
    pki = kit_home() / "pki"
    return ensure(nodes, pki / "ca.crt", pki / "ca.key")


def cm_per_kubelet(wanted: int, pods_per_node: int, cert_dir: str) -> int:
    """ConfigMaps each kubelet watches: as a node it may read only those its pods mount (Node authorizer)."""
    if not cert_dir:
        return wanted
    return min(wanted, pods_per_node, CM_STRIDE)


def proxy_flags(cert_dir: str) -> list[str]:
    """The proxy's flags to authenticate node certificates (the kit's CA) and pass their requests through."""
    if not cert_dir:
        return []
    out = ["--client-ca-file", os.environ.get("KUBE_REFERENCE_CA") or str(kit_home() / "pki/ca.crt")]
    if os.environ.get("KUBE_REFERENCE_FRONT_PROXY_CERT"):
        out += ["--proxy-client-cert-file", os.environ["KUBE_REFERENCE_FRONT_PROXY_CERT"]]
        out += ["--proxy-client-key-file", os.environ["KUBE_REFERENCE_FRONT_PROXY_KEY"]]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    home = kit_home()
    p.add_argument("--ca-cert", type=Path, default=home / "pki/ca.crt")
    p.add_argument("--ca-key", type=Path, default=home / "pki/ca.key")
    p.add_argument("--prefix", required=True, help="node names: <prefix>00000, <prefix>00001, …")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--procs", type=int, default=2, help="openssl processes at once")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    names = [f"{args.prefix}{i:05d}" for i in range(args.count)]
    directory = ensure(names, args.ca_cert, args.ca_key, procs=args.procs)
    print(f"{len(names)} node certificates in {directory} ({time.monotonic() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()

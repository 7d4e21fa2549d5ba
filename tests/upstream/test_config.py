import base64
import os
import ssl
import tempfile
import textwrap

import pytest

from harness.pki import Pki
from watchcache.upstream.config import UpstreamConfigError, from_flags, load_cert_chain_data
from watchcache.upstream.kubeconfig import from_kubeconfig


def write_kubeconfig(tmp_path, body: str):
    path = tmp_path / "config"
    path.write_text(textwrap.dedent(body))
    return path


def test_kubeconfig_current_context_token_and_relative_ca(tmp_path):
    (tmp_path / "ca.crt").write_text("x")
    path = write_kubeconfig(
        tmp_path,
        """
        apiVersion: v1
        kind: Config
        current-context: prod
        contexts:
        - name: prod
          context: {cluster: c1, user: u1}
        - name: dev
          context: {cluster: c2, user: u2}
        clusters:
        - name: c1
          cluster: {server: "https://10.0.0.1:6443/", certificate-authority: ca.crt}
        - name: c2
          cluster: {server: "https://dev:6443", insecure-skip-tls-verify: true}
        users:
        - name: u1
          user: {token: s3cret}
        - name: u2
          user: {tokenFile: tok}
        """,
    )
    cfg = from_kubeconfig(path)
    assert cfg.server == "https://10.0.0.1:6443"
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    assert cfg.token == "s3cret" and not cfg.insecure
    assert "s3cret" not in cfg.describe()
    dev = from_kubeconfig(path, "dev")
    assert dev.insecure and dev.token_file == str(tmp_path / "tok")


def test_kubeconfig_data_fields_stay_in_memory_and_load_into_tls(tmp_path, monkeypatch):
    """*-data fields are never written to a file (issue 21.7: they were, and never removed): the TLS
    context loads them through an anonymous memory file, and nothing is left in the temp directory."""
    pki = Pki(tmp_path)
    ca = pki.ca("ca", "/CN=test-ca")
    client = pki.issue(ca, "client", "/CN=watchcache")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    tempfile.tempdir = None  # re-read TMPDIR
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    path = write_kubeconfig(
        tmp_path,
        f"""
        current-context: x
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        clusters: [{{name: c, cluster: {{server: "https://h:6443", certificate-authority-data: {b64(ca.crt)}}}}}]
        users: [{{name: u, user: {{client-certificate-data: {b64(client.crt)}, client-key-data: {b64(client.key)}}}}}]
        """,
    )
    fds = len(os.listdir("/proc/self/fd"))
    try:
        cfg = from_kubeconfig(path)
        assert cfg.client_cert is None and cfg.client_key is None
        assert cfg.client_cert_data == client.crt.read_bytes() and cfg.ca_data == ca.crt.read_text()
        ctx = cfg.ssl_context()
        assert ctx is not None and ctx.get_ca_certs()[0]["subject"] == ((("commonName", "test-ca"),),)
        for _ in range(20):
            cfg.ssl_context()
    finally:
        tempfile.tempdir = None
    assert list(tmp.iterdir()) == []
    assert len(os.listdir("/proc/self/fd")) == fds  # the memory files are closed


def test_the_pem_is_loaded_from_a_private_temp_file_when_memfd_is_missing(tmp_path, monkeypatch):
    pki = Pki(tmp_path)
    pair = pki.issue(pki.ca("ca", "/CN=ca"), "c", "/CN=c")
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    tempfile.tempdir = None
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        load_cert_chain_data(ctx, pair.crt.read_bytes(), pair.key.read_bytes())
    finally:
        tempfile.tempdir = None
    assert list((tmp_path / "t").iterdir()) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("contexts: []\nclusters: []\nusers: []\n", "no current-context"),
        ("current-context: nope\ncontexts: []\n", "no context named 'nope'"),
    ],
    ids=["no-current-context", "unknown-context"],
)
def test_kubeconfig_errors_are_clear(tmp_path, body, message):
    path = write_kubeconfig(tmp_path, body)
    with pytest.raises(UpstreamConfigError, match=message):
        from_kubeconfig(path)


def test_flags_validate_url_and_cert_pairs():
    with pytest.raises(UpstreamConfigError, match="http"):
        from_flags("10.0.0.1:6443")
    with pytest.raises(UpstreamConfigError, match="go together"):
        from_flags("https://h", client_certificate="c")
    assert from_flags("http://127.0.0.1:8081/").server == "http://127.0.0.1:8081"
    assert from_flags("http://127.0.0.1:8081").ssl_context() is None

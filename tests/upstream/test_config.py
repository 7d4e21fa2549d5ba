import base64
import os
import stat
import textwrap
from pathlib import Path

import pytest

from watchcache.upstream.config import UpstreamConfigError, from_flags, from_kubeconfig


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


def test_kubeconfig_inline_client_cert_data_is_written_to_private_files(tmp_path):
    cert = base64.b64encode(b"CERT").decode()
    key = base64.b64encode(b"KEY").decode()
    ca = base64.b64encode(b"CA PEM").decode()
    path = write_kubeconfig(
        tmp_path,
        f"""
        current-context: x
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        clusters: [{{name: c, cluster: {{server: "https://h:6443", certificate-authority-data: {ca}}}}}]
        users: [{{name: u, user: {{client-certificate-data: {cert}, client-key-data: {key}}}}}]
        """,
    )
    cfg = from_kubeconfig(path)
    assert cfg.ca_data == "CA PEM"
    assert Path(cfg.client_cert).read_bytes() == b"CERT"
    assert stat.S_IMODE(os.stat(cfg.client_key).st_mode) == 0o600


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("contexts: []\nclusters: []\nusers: []\n", "no current-context"),
        ("current-context: nope\ncontexts: []\n", "no context named 'nope'"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
            "users: [{name: u, user: {exec: {command: aws}}}]\n",
            "exec/auth-provider credentials are not supported",
        ),
    ],
    ids=["no-current-context", "unknown-context", "exec-plugin"],
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

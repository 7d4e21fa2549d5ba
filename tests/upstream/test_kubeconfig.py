"""Kubeconfig loading rules (``upstream/kubeconfig.py``), checked against kubectl itself.

kubectl's ``config view --minify --flatten --raw`` prints the cluster and user that kubectl's own
loading rules pick for the current (or ``--context``) context, with files inlined: the same files,
``KUBECONFIG`` and home directory go to both, and the two must agree on every field.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.tools import KUBECTL_INSTALL, require
from watchcache.upstream.config import UpstreamConfig, UpstreamConfigError
from watchcache.upstream.credentials import Credentials
from watchcache.upstream.kubeconfig import NoKubeconfig, UpstreamFlags, load, upstream_from_flags

PEM_CA = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"


def write(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


def kubectl_view(env: dict[str, str], *args: str) -> dict[str, Any]:
    """What kubectl resolves: the minified, flattened config of the chosen context."""
    kubectl = require("kubectl", KUBECTL_INSTALL)
    out = subprocess.run(
        [kubectl, "config", "view", "--minify", "--flatten", "--raw", "-o", "yaml", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def expected(view: dict[str, Any], token_dir: Path | None) -> dict[str, Any]:
    """The fields of kubectl's view that our UpstreamConfig carries. ``config view`` prints a tokenFile
    as written; client-go resolves it against the file that names it (``GetAuthInfoFileReferences``):
    ``token_dir``."""
    cluster = view["clusters"][0]["cluster"]
    user = view["users"][0]["user"] if view.get("users") else {}
    token_file = None
    if user.get("tokenFile"):
        assert token_dir is not None
        token_file = token_dir / user["tokenFile"]

    def b64(key: str, where: dict[str, Any]) -> bytes | None:
        return base64.b64decode(where[key]) if where.get(key) else None

    return {
        "server": cluster["server"].rstrip("/"),
        "ca": b64("certificate-authority-data", cluster),
        "insecure": bool(cluster.get("insecure-skip-tls-verify")),
        "tls_server_name": cluster.get("tls-server-name"),
        "proxy_url": cluster.get("proxy-url"),
        # kubectl's --flatten inlines certificates, not token files.
        "token": user.get("token") or (token_file.read_text().strip() if token_file else None),
        "cert": b64("client-certificate-data", user),
        "key": b64("client-key-data", user),
        "username": user.get("username"),
        "password": user.get("password"),
        "exec": (user.get("exec") or {}).get("command"),
    }


def ours(config: UpstreamConfig) -> dict[str, Any]:
    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    token = config.token or (Path(config.token_file).read_text().strip() if config.token_file else None)
    return {
        "server": config.server,
        "ca": config.ca_data.encode("latin-1") if config.ca_data else read(config.ca_file),
        "insecure": config.insecure,
        "tls_server_name": config.tls_server_name,
        "proxy_url": config.proxy_url,
        "token": token,
        "cert": config.client_cert_data or read(config.client_cert),
        "key": config.client_key_data or read(config.client_key),
        "username": config.username,
        "password": config.password,
        "exec": config.exec.command if config.exec else None,
    }


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def env_for(home: Path, kubeconfig: str | None) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "")}
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return env


def both(
    home: Path,
    kubeconfig: str | None,
    context: str | None = None,
    explicit: str | None = None,
    token_dir: Path | None = None,
) -> None:
    """Our loader and kubectl pick the same cluster and user."""
    env = env_for(home, kubeconfig)
    args = [f"--context={context}"] if context else []
    if explicit:
        args.append(f"--kubeconfig={explicit}")
    view = kubectl_view(env, *args)
    config = load(explicit, context, env=env, home=home, service_account_dir=home / "no-sa")
    assert ours(config) == expected(view, token_dir)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Two kubeconfig files in different directories, overlapping in names, each with relative paths."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    write(a_dir / "ca.crt", PEM_CA.replace("CA", "CA-A"))
    write(b_dir / "ca.crt", PEM_CA.replace("CA", "CA-B"))
    write(b_dir / "token", "token-from-b-file\n")
    write(b_dir / "client.crt", "CERT-B")
    write(b_dir / "client.key", "KEY-B")
    cert = base64.b64encode(b"CERT-INLINE").decode()
    key = base64.b64encode(b"KEY-INLINE").decode()
    a = write(
        a_dir / "config",
        f"""
        apiVersion: v1
        kind: Config
        current-context: a-ctx
        clusters:
        - name: shared
          cluster: {{server: "https://a.example:6443/", certificate-authority: ca.crt, tls-server-name: api.a}}
        - name: a-only
          cluster: {{server: "https://a-only.example:443", insecure-skip-tls-verify: true,
                    proxy-url: "socks5://127.0.0.1:1080"}}
        users:
        - name: shared-user
          user: {{token: token-from-a}}
        - name: a-user
          user: {{client-certificate-data: {cert}, client-key-data: {key}}}
        contexts:
        - name: a-ctx
          context: {{cluster: shared, user: shared-user}}
        - name: inline
          context: {{cluster: a-only, user: a-user}}
        """,
    )
    b = write(
        b_dir / "config",
        """
        apiVersion: v1
        kind: Config
        current-context: b-ctx
        clusters:
        - name: shared
          cluster: {server: "https://b.example:6443", certificate-authority: ca.crt}
        - name: b-only
          cluster: {server: "https://b-only.example:6443", certificate-authority: ca.crt,
                    proxy-url: "http://proxy.example:3128"}
        users:
        - name: shared-user
          user: {token: token-from-b}
        - name: b-user
          user: {tokenFile: token}
        - name: b-cert
          user: {client-certificate: client.crt, client-key: client.key}
        - name: b-basic
          user: {username: admin, password: s3cret}
        contexts:
        - name: b-ctx
          context: {cluster: b-only, user: b-user}
        - name: a-ctx
          context: {cluster: b-only, user: b-cert}
        - name: b-cert
          context: {cluster: shared, user: b-cert}
        - name: b-basic
          context: {cluster: b-only, user: b-basic}
        """,
    )
    return {"a": a, "b": b}


@pytest.mark.parametrize("context", [None, "a-ctx", "inline", "b-ctx", "b-cert", "b-basic"])
def test_kubeconfig_merged_as_kubectl_merges_it(home: Path, files: dict[str, Path], context: str | None) -> None:
    # KUBECONFIG=a:b: first file wins each name and current-context; relative paths per file.
    both(home, f"{files['a']}{os.pathsep}{files['b']}", context, token_dir=files["b"].parent)


@pytest.mark.parametrize("context", [None, "b-ctx", "a-ctx"])
def test_order_of_kubeconfig_decides_who_wins(home: Path, files: dict[str, Path], context: str | None) -> None:
    both(home, f"{files['b']}{os.pathsep}{files['a']}", context, token_dir=files["b"].parent)


def test_missing_files_in_kubeconfig_are_skipped(home: Path, files: dict[str, Path], tmp_path: Path) -> None:
    both(home, f"{tmp_path / 'missing'}{os.pathsep}{files['b']}", token_dir=files["b"].parent)


def test_explicit_kubeconfig_wins_over_kubeconfig_env(home: Path, files: dict[str, Path]) -> None:
    both(home, str(files["a"]), explicit=str(files["b"]), token_dir=files["b"].parent)
    both(home, str(files["a"]), context="inline", explicit=str(files["a"]))


def test_home_kubeconfig_when_kubeconfig_unset(home: Path, files: dict[str, Path]) -> None:
    write(home / ".kube" / "config", files["b"].read_text().replace("ca.crt", str(files["b"].parent / "ca.crt")))
    both(home, None, "b-basic")
    config = load(env={}, home=home, service_account_dir=home / "no-sa")
    assert config.server == "https://b-only.example:6443"
    assert str(home / ".kube" / "config") in config.source


def service_account(root: Path) -> Path:
    write(root / "token", "sa-token\n")
    write(root / "ca.crt", PEM_CA)
    return root


def test_in_cluster_only_when_no_kubeconfig_is_found(home: Path, files: dict[str, Path], tmp_path: Path) -> None:
    sa = service_account(tmp_path / "sa")
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load(env=pod, home=home, service_account_dir=sa)
    assert config.server == "https://10.96.0.1:443"
    assert config.token_file == str(sa / "token") and config.ca_file == str(sa / "ca.crt")
    # A kubeconfig found by any rule wins over the pod's service account, as in client-go.
    config = load(env={**pod, "KUBECONFIG": str(files["b"])}, home=home, service_account_dir=sa)
    assert config.server == "https://b-only.example:6443"
    # Without the token file it is not a pod.
    with pytest.raises(NoKubeconfig, match="not a pod"):
        load(env=pod, home=home, service_account_dir=tmp_path / "nothing")


def test_nothing_found_is_a_clear_error(home: Path, tmp_path: Path) -> None:
    with pytest.raises(NoKubeconfig, match=r"KUBECONFIG is unset, .*\.kube/config does not exist.*--simulated"):
        load(env={}, home=home, service_account_dir=tmp_path)
    with pytest.raises(NoKubeconfig, match="KUBECONFIG=/nope/config"):
        load(env={"KUBECONFIG": "/nope/config"}, home=home, service_account_dir=tmp_path)
    with pytest.raises(UpstreamConfigError, match="--kubeconfig /nope: no such file"):
        load("/nope", env={}, home=home)


def test_serve_without_any_upstream_exits_with_the_reason(tmp_path: Path) -> None:
    """The command line: no flag, no KUBECONFIG, no ~/.kube/config, not a pod: exit 2 and say so, never
    serve a simulated cluster silently."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "watchcache", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "no upstream apiserver found" in out.stderr and "--simulated" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "watchcache", "serve", "--sim-objects", "5"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and "add --simulated" in out.stderr


def test_flags_that_name_different_upstreams_are_refused(files: dict[str, Path]) -> None:
    with pytest.raises(UpstreamConfigError, match="choose one"):
        upstream_from_flags(UpstreamFlags(upstream="https://x", kubeconfig=str(files["a"])))
    with pytest.raises(UpstreamConfigError, match="choose one"):
        upstream_from_flags(UpstreamFlags(simulated=True, in_cluster=True))
    with pytest.raises(UpstreamConfigError, match="--token-file apply to --upstream"):
        upstream_from_flags(UpstreamFlags(kubeconfig=str(files["a"]), token_file="t"))
    with pytest.raises(UpstreamConfigError, match="does not apply to --upstream"):
        upstream_from_flags(UpstreamFlags(upstream="https://x", context="c"))
    assert upstream_from_flags(UpstreamFlags(simulated=True)) is None
    assert upstream_from_flags(UpstreamFlags(kubeconfig=str(files["a"]), context="inline")).server == (
        "https://a-only.example:443"
    )


def one_user(tmp_path: Path, user: str, cluster: str = '{server: "https://h:6443"}') -> Path:
    return write(
        tmp_path / "kc",
        f"""
        current-context: x
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        clusters: [{{name: c, cluster: {cluster}}}]
        users: [{{name: u, user: {user}}}]
        """,
    )


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ("{auth-provider: {name: gcp}}", None, "auth-provider 'gcp' is not supported.*exec plugin"),
        ("{token: t, as: someone}", None, r"impersonation \(as\) is not supported"),
        ("{token: t, username: u, password: p}", None, "more than one authentication method"),
        ("{username: u}", None, "username and password go together"),
        ("{tokne: t}", None, r"unknown field\(s\) tokne"),
        ("{client-certificate-data: Q0VSVA==}", None, "needs its key"),
        ("{token: t}", '{server: "https://h", proxy-url: "ftp://p:1"}', "proxy-url 'ftp://p:1' has scheme 'ftp'"),
        ("{token: t}", '{server: "https://h", certificate-authority: /nope.crt}', "certificate-authority /nope.crt"),
        ("{exec: {command: sh}}", None, r"exec.apiVersion None is not supported"),
        (
            "{exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}}",
            None,
            "interactiveMode must be set",
        ),
        (
            "{exec: {command: sh, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}}",
            None,
            "interactiveMode is Always, but standard input is not a terminal",
        ),
        (
            "{exec: {command: no-such-plugin, apiVersion: client.authentication.k8s.io/v1beta1, "
            "installHint: 'brew install it'}}",
            None,
            "(?s)exec plugin .no-such-plugin. not found.*brew install it",
        ),
    ],
)
def test_what_cannot_work_is_refused_at_start(tmp_path: Path, user: str, cluster: str | None, message: str) -> None:
    path = one_user(tmp_path, user, cluster or '{server: "https://h:6443"}')
    with pytest.raises(UpstreamConfigError, match=message):
        load(str(path), env={}, home=tmp_path)


def test_username_and_password_are_sent_as_basic_auth(tmp_path: Path) -> None:
    config = load(str(one_user(tmp_path, "{username: admin, password: 's3:cret'}")), env={}, home=tmp_path)
    assert Credentials(config).headers() == {"Authorization": "Basic " + base64.b64encode(b"admin:s3:cret").decode()}
    assert "s3:cret" not in config.describe() and "auth: basic" in config.describe()


def test_bare_host_server_gets_a_scheme_as_in_client_go(tmp_path: Path) -> None:
    path = one_user(tmp_path, "{token: t}", "{server: 'h:6443', insecure-skip-tls-verify: true}")
    assert load(str(path), env={}, home=tmp_path).server == "https://h:6443"
    path = one_user(tmp_path, "{token: t}", "{server: 'h:8080'}")
    assert load(str(path), env={}, home=tmp_path).server == "http://h:8080"


def test_proxy_url_password_is_not_logged(tmp_path: Path) -> None:
    path = one_user(tmp_path, "{token: t}", '{server: "https://h", proxy-url: "http://me:pw@proxy:3128"}')
    config = load(str(path), env={}, home=tmp_path)
    assert config.proxy_url == "http://me:pw@proxy:3128"
    assert "pw" not in config.describe() and "proxy: http://me:***@proxy:3128" in config.describe()

"""Exec credential plugins (``upstream/credentials.py``) with a real plugin process: what it is given,
how its answer is checked, cached until it expires, and run again after a 401."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import pytest

from harness.pki import Pki
from tests.support.execplugin import ExecPlugin, kubeconfig
from watchcache.upstream.config import ExecConfig, UpstreamConfig
from watchcache.upstream.credentials import CredentialError, Credentials, run_exec
from watchcache.upstream.kubeconfig import load


@pytest.fixture
def plugin(tmp_path: Path) -> ExecPlugin:
    p = ExecPlugin(tmp_path)
    p.set("token", "t-1")
    return p


def loaded(tmp_path: Path, plugin: ExecPlugin, **kw: object) -> UpstreamConfig:
    path = kubeconfig(tmp_path / "kubeconfig", "https://10.0.0.1:6443", plugin, **kw)  # type: ignore[arg-type]
    return load(str(path), env={}, home=tmp_path)


@pytest.mark.parametrize("version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_plugin_gets_exec_info_cluster_and_env_and_its_token_is_used(
    tmp_path: Path, plugin: ExecPlugin, version: str
) -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n").decode()
    config = loaded(tmp_path, plugin, api_version=version, ca_b64=ca, cluster={"tls-server-name": "api"})
    assert config.exec is not None and config.exec.api_version == version
    credentials = Credentials(config)
    assert asyncio.run(credentials.fresh_headers()) == {"Authorization": "Bearer t-1"}
    (run,) = plugin.runs()
    info = run["info"]
    assert info["apiVersion"] == version and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    # provideClusterInfo: the cluster as client-go's ExecCredential Cluster (kubeconfig field names).
    assert info["spec"]["cluster"] == {
        "server": "https://10.0.0.1:6443",
        "tls-server-name": "api",
        "certificate-authority-data": ca,
        "config": {"audience": "watchcache-tests"},
    }
    assert run["env"] == "from-kubeconfig"
    assert run["stdin_tty"] is False


def test_credential_is_cached_until_it_expires(tmp_path: Path, plugin: ExecPlugin) -> None:
    plugin.set("ttl", "2")
    credentials = Credentials(loaded(tmp_path, plugin))

    async def scenario() -> None:
        assert await credentials.fresh_headers() == {"Authorization": "Bearer t-1"}
        plugin.set("token", "t-2")
        for _ in range(5):
            assert await credentials.fresh_headers() == {"Authorization": "Bearer t-1"}
        assert len(plugin.runs()) == 1
        assert credentials.credential is not None and credentials.credential.expires is not None
        await asyncio.sleep(max(0.0, credentials.credential.expires - time.time()) + 0.1)
        assert await credentials.fresh_headers() == {"Authorization": "Bearer t-2"}
        assert len(plugin.runs()) == 2

    asyncio.run(scenario())


def test_a_401_runs_the_plugin_again_once_per_credential(tmp_path: Path, plugin: ExecPlugin) -> None:
    credentials = Credentials(loaded(tmp_path, plugin))  # no expiry: only a 401 refreshes it

    async def scenario() -> None:
        sent = await credentials.fresh_headers()
        plugin.set("token", "t-2")
        assert await credentials.fresh_headers() == sent and len(plugin.runs()) == 1
        credentials.rejected(sent)
        credentials.rejected(sent)  # several requests failed with it: one run
        assert await credentials.fresh_headers() == {"Authorization": "Bearer t-2"}
        assert len(plugin.runs()) == 2
        credentials.rejected(sent)  # a late 401 to the old credential: the new one stays
        assert await credentials.fresh_headers() == {"Authorization": "Bearer t-2"}
        assert len(plugin.runs()) == 2

    asyncio.run(scenario())


def test_concurrent_requests_share_one_run(tmp_path: Path, plugin: ExecPlugin) -> None:
    credentials = Credentials(loaded(tmp_path, plugin))

    async def scenario() -> list[dict[str, str]]:
        return await asyncio.gather(*(credentials.fresh_headers() for _ in range(20)))

    assert all(h == {"Authorization": "Bearer t-1"} for h in asyncio.run(scenario()))
    assert len(plugin.runs()) == 1


def test_failures_say_what_the_plugin_said_and_are_retried(tmp_path: Path, plugin: ExecPlugin) -> None:
    plugin.set("fail", "the cloud CLI is not logged in")
    credentials = Credentials(loaded(tmp_path, plugin))

    async def scenario() -> None:
        with pytest.raises(CredentialError, match=r"exited with 1: the cloud CLI is not logged in"):
            await credentials.fresh_headers()
        plugin.set("fail", None)
        assert await credentials.fresh_headers() == {"Authorization": "Bearer t-1"}

    asyncio.run(scenario())
    assert credentials.failures == 1 and credentials.runs == 2
    assert isinstance(CredentialError("x"), OSError)  # callers back off as from an unreachable upstream


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        (b"not json", "output is not JSON"),
        (b'{"kind": "Status"}', "not an ExecCredential"),
        (b'{"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1beta1", "status": {}}',
         "configured to use API version client.authentication.k8s.io/v1, plugin returned version"),
        (b'{"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1", "status": {}}',
         "didn't return a token or cert/key pair"),
        (b'{"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1", '
         b'"status": {"clientCertificateData": "x"}}', "must both be present"),
        (b'{"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1", '
         b'"status": {"token": "t", "expirationTimestamp": "tomorrow"}}', "not an RFC 3339 time"),
    ],
)  # fmt: skip
def test_bad_answers_are_refused(tmp_path: Path, stdout: bytes, message: str) -> None:
    script = tmp_path / "plugin"
    (tmp_path / "out").write_bytes(stdout)
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'out'}\n")
    script.chmod(0o755)
    with pytest.raises(CredentialError, match=message):
        asyncio.run(run_exec(ExecConfig(command=str(script))))


def test_a_plugin_certificate_is_handed_over_in_memory(tmp_path: Path, plugin: ExecPlugin) -> None:
    pki = Pki(tmp_path)
    pair = pki.issue(pki.ca("ca", "/CN=ca"), "proxy", "/CN=watchcache")
    plugin.set("token", None)
    plugin.set("cert", str(pair.crt))
    plugin.set("key", str(pair.key))
    credentials = Credentials(loaded(tmp_path, plugin))
    got: list[tuple[bytes, bytes]] = []
    credentials.on_certificate = lambda cert, key: got.append((cert, key))
    assert asyncio.run(credentials.fresh_headers()) == {}
    assert got == [(pair.crt.read_bytes(), pair.key.read_bytes())]

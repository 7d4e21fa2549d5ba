"""A kube-apiserver of our own, over the kit's etcd, for what the shared one cannot be used for.

The kit's apiserver is shared: it must never be restarted, and while the kit's own
kube-controller-manager runs (``start.sh --control-plane``), a second controller manager on it
would fight the first over every object. This apiserver is the kit's binary with the kit's PKI
and flags (``start.sh``), on a free port, storing under an etcd prefix of its own
(``/i20t-<random>``): a separate cluster that shares only the etcd process. It does not compact
etcd (``--etcd-compaction-interval=0``: the kit's apiserver does), and ``close`` deletes its whole
prefix through etcd's JSON gateway. Restartable, to measure a client fleet across an apiserver
restart.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.kube.kit import Api, KubeEnv, wait_for, write_kubeconfig
from harness.processes import dies_with_parent, free_port


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class PrivateApiserver:
    kit: KubeEnv
    workdir: Path
    port: int = field(default_factory=free_port)
    prefix: str = field(default_factory=lambda: f"/i20t-{os.urandom(4).hex()}")
    process: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)  # more kube-apiserver flags, e.g. an admission plugin off

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def log(self) -> Path:
        return self.workdir / "kube-apiserver.log"

    def env(self) -> KubeEnv:
        """The kit's environment, pointed at this apiserver (same tokens, CA and binaries)."""
        kubeconfig = write_kubeconfig(self.workdir / "private.kubeconfig", self.url, self.kit.ca, self.kit.token)
        return replace(self.kit, url=self.url, kubeconfig=str(kubeconfig), control_plane=False)

    def argv(self) -> list[str]:
        pki = self.kit.home / "pki"
        etcd = os.environ.get("KUBE_REFERENCE_ETCD_URL", "http://127.0.0.1:22379")
        return [
            str(self.kit.bin / "kube-apiserver"),
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--etcd-servers={etcd}", f"--etcd-prefix={self.prefix}", "--etcd-compaction-interval=0",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            "--anonymous-auth=false", f"--token-auth-file={pki / 'tokens.csv'}", f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC", f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true", *self.extra,
        ]  # fmt: skip

    def launch(self) -> None:
        """Start it, without waiting for it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=dies_with_parent(),
            )

    def start(self, timeout: float = 120.0) -> float:
        """Start it; the seconds until /readyz is 200."""
        self.launch()
        api = Api(self.url, self.kit.token, self.kit.ca, timeout=2)

        def ready() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                return api.raw("GET", "/readyz")[0] == 200
            except OSError:
                return False

        try:
            return wait_for(ready, timeout, "the private kube-apiserver's /readyz", interval=0.05)
        finally:
            api.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self, timeout: float = 120.0) -> float:
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop it and delete everything it stored."""
        self.stop()
        etcd = os.environ.get("KUBE_REFERENCE_ETCD_URL", "http://127.0.0.1:22379")
        # Every key under "<prefix>/": the range ["<prefix>/", "<prefix>0") ('0' follows '/').
        body = json.dumps({"key": _b64(self.prefix + "/"), "range_end": _b64(self.prefix + "0")}).encode()
        request = urllib.request.Request(etcd + "/v3/kv/deleterange", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()

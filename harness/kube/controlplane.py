"""kube-controller-manager and kube-scheduler from the kit's binaries, pointed at one server.

Started as the kit's start.sh starts them (same flags and PKI), except for the kubeconfig — the
proxy's or the apiserver's — their ports (free ones, so the kit's own stay free) and their
verbosity: ``-v=2`` plus ``reflector.go`` at 4, so that every (re)list ("Caches populated"), every
watch end ("Watch close") and every decode error of their informers is in the log, which
``LogCounts`` counts.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import ssl
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.kube.kit import KubeEnv, wait_for
from harness.processes import free_port

# What the tier counts in the components' logs, by name (each a regular expression on a line).
PATTERNS: dict[str, str] = {
    "decode errors": (
        r"unable to decode watch event|no kind \\?\"[^\"]*\\?\" is registered|Unable to understand watch event"
    ),
    "informers (Starting reflector)": r"\"Starting reflector\"",
    "lists (Caches populated)": r"\"Caches populated\"",
    "watch ends (Watch close)": r"\"Watch close\"|\"Watch closed\"",
    "too old resource version": r"too old resource version",
    "Unauthorized": r"Unauthorized",
    "Forbidden": r"Forbidden|forbidden",
    "RS read-version requeues": r"is not as new as written version",
    "watch errors": r"Warning: watch ended with error|Failed to watch",
}
#: Lines a pattern does not count when a CRD that existed as the components started was deleted while
#: they ran (the tier's other tests create and delete theirs on the shared apiserver: under ``-n 2``
#: test_differential's ``<worker>.diff.reference.example.com`` may go meanwhile). The garbage collector
#: and the quota monitor watch every resource they discover through metadata informers; a deleted CRD
#: ends that watch at once and its relists get kube's 404, direct to kube-apiserver as through the
#: proxy, and client-go's lines do not name the resource. Any of each form counts (each expression
#: must match), and only from metadata informers.
VANISHED: dict[str, tuple[tuple[str, ...], ...]] = {
    "watch errors": (
        (r"the server could not find the requested resource", r'type="\*v1\.PartialObjectMetadata"'),
        (r"very short watch", r'type="\*v1\.PartialObjectMetadata"'),
    ),
}


def matches(name: str, line: str, crd_vanished: bool = False) -> bool:
    """Whether ``line`` counts as PATTERNS[name] (with ``crd_vanished``: not if VANISHED[name] explains it)."""
    if not re.search(PATTERNS[name], line):
        return False
    if crd_vanished:
        for form in VANISHED.get(name, ()):
            if all(re.search(p, line) for p in form):
                return False
    return True


def other_controller_manager(kube: KubeEnv) -> str | None:
    """Why this tier must not start one: the kit's own runs, or another process is one (two
    controller managers would fight over every object). None when there is none."""
    if kube.control_plane:
        return "the kit's kube-controller-manager runs (KUBE_REFERENCE_CONTROL_PLANE=1): stop.sh, then start.sh"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if os.path.basename(exe.removesuffix(" (deleted)")) == "kube-controller-manager":
            return f"a kube-controller-manager already runs (pid {pid}): two would fight over every object"
    return None


@dataclass
class Component:
    name: str
    process: subprocess.Popen
    port: int
    log: Path

    def healthy(self) -> bool:
        """``/healthz`` answers ``ok`` (its serving certificate is self-signed: not verified)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=2)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            return resp.status == 200 and resp.read() == b"ok"
        except OSError:
            return False
        finally:
            conn.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ControlPlane:
    """A controller manager and a scheduler, both reading and writing through ``kubeconfig``."""

    kube: KubeEnv
    kubeconfig: Path
    workdir: Path
    # --authentication-kubeconfig / --authorization-kubeconfig (default: the same kubeconfig)
    auth_kubeconfig: Path | None = None
    components: list[Component] = field(default_factory=list)

    def start(self) -> None:
        pki = self.kube.home / "pki"
        kc = str(self.kubeconfig)
        auth = str(self.auth_kubeconfig or self.kubeconfig)
        self.workdir.mkdir(parents=True, exist_ok=True)
        common = [
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={auth}", f"--authorization-kubeconfig={auth}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "-v=2", "--vmodule=reflector=4",
        ]  # fmt: skip
        kcm = [
            "--controllers=*", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        ]  # fmt: skip
        self.components = [
            self._launch("kube-controller-manager", [*common, *kcm]),
            self._launch("kube-scheduler", common),
        ]
        for c in self.components:
            wait_for(lambda c=c: c.healthy() or c.process.poll() is not None, 90, f"{c.name} /healthz")
            if c.process.poll() is not None:
                raise AssertionError(f"{c.name} exited ({c.process.returncode}):\n{c.text()[-3000:]}")

    def _launch(self, name: str, args: list[str]) -> Component:
        port = free_port()
        log = self.workdir / f"{name}.log"
        certs = self.workdir / f"{name}-certs"
        cmd = [str(self.kube.bin / name), *args, f"--secure-port={port}", f"--cert-dir={certs}"]
        with log.open("ab") as out:
            process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return Component(name, process, port, log)

    def wait_synced(self, timeout: float = 120) -> float:
        """Until the garbage collector's monitors have synced (the last controller to be ready) and
        the scheduler's informers: the seconds it took from now."""
        kcm, scheduler = self.components

        def synced() -> bool:
            for c in self.components:
                if c.process.poll() is not None:
                    raise AssertionError(f"{c.name} exited ({c.process.returncode}):\n{c.text()[-3000:]}")
            return "Proceeding to collect garbage" in kcm.text() and "Caches are synced" in scheduler.text()

        return wait_for(synced, timeout, "controller manager and scheduler synced", interval=0.2)

    def counts(self, crd_vanished: bool = False) -> dict[str, Counter[str]]:
        """Per component, how many log lines match each of PATTERNS (``matches``)."""
        out: dict[str, Counter[str]] = {}
        for c in self.components:
            counter: Counter[str] = Counter({name: 0 for name in PATTERNS})
            for line in c.text().splitlines():
                for name in PATTERNS:
                    if matches(name, line, crd_vanished):
                        counter[name] += 1
            out[c.name] = counter
        return out

    def lines(self, name: str) -> list[str]:
        """Log lines of both components matching PATTERNS[name] (for failure messages)."""
        return [line for c in self.components for line in c.text().splitlines() if matches(name, line)]

    def stop(self) -> None:
        for c in self.components:
            c.stop()

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

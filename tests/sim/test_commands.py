"""The simulated pods' command set (what kubectl exec and kubectl cp run there)."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

from watchcache.sim import commands
from watchcache.sim.commands import NotFound, PodFiles, Process, run


class Session:
    def __init__(self, stdin: list[bytes] | None = None, files: PodFiles | None = None) -> None:
        self.stdin = list(stdin or [])
        self.out = bytearray()
        self.err = bytearray()
        self.files = files or PodFiles()

    async def _read(self) -> bytes | None:
        return self.stdin.pop(0) if self.stdin else None

    async def _out(self, data: bytes) -> None:
        self.out += data

    async def _err(self, data: bytes) -> None:
        self.err += data

    def run(self, *argv: str) -> int:
        proc = Process("ns", "pod-1", self.files, self._read, self._out, self._err)
        return asyncio.run(run(list(argv), proc))


def test_echo_cat_and_exit_codes() -> None:
    s = Session(stdin=[b"a", b"b"])
    assert s.run("echo", "hello", "world") == 0 and s.out == b"hello world\n"
    assert s.run("/bin/cat") == 0 and s.out.endswith(b"ab")
    assert Session().run("false") == 1
    with pytest.raises(NotFound):
        Session().run("no-such-command")


def test_sh_sequences_and_conditionals_and_stderr() -> None:
    s = Session()
    code = s.run("sh", "-c", "echo x >&2; echo y && false && echo skipped; echo z; exit 3; echo never")
    assert code == 3
    assert s.out == b"y\nz\n" and s.err == b"x\n"
    s = Session()
    assert s.run("sh", "-c", "nope") == 127 and b"nope: not found" in s.err
    s = Session()
    assert s.run("sh", "-c", "echo a | cat") == 2 and b"not supported" in s.err


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_kubectl_cp_round_trip_through_tar() -> None:
    files = PodFiles()
    upload = tar_of({"dest/report.txt": b"numbers\n"})
    s = Session(stdin=[upload[:100], upload[100:]], files=files)
    assert s.run("test", "-d", "/tmp") == 0
    assert s.run("tar", "--no-same-permissions", "--no-same-owner", "-xmf", "-", "-C", "/tmp") == 0
    assert files.of("ns", "pod-1") == {"/tmp/dest/report.txt": b"numbers\n"}
    assert s.run("test", "-d", "/tmp/dest") == 0 and s.run("test", "-f", "/tmp/dest/report.txt") == 0
    down = Session(files=files)
    assert down.run("tar", "cf", "-", "/tmp/dest/report.txt") == 0
    with tarfile.open(fileobj=io.BytesIO(bytes(down.out))) as tar:
        member = tar.getmember("tmp/dest/report.txt")  # no leading slash, as GNU tar writes it
        extracted = tar.extractfile(member)
        assert extracted is not None and extracted.read() == b"numbers\n"
    missing = Session(files=files)
    assert missing.run("tar", "cf", "-", "/tmp/none") == 2 and b"No such file" in missing.err


def test_pod_files_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "MAX_FILE_BYTES", 1000)
    files = PodFiles()
    files.write("ns", "a", "/tmp/one", b"x" * 600)
    with pytest.raises(OSError, match="no space left"):
        files.write("ns", "b", "/tmp/two", b"y" * 600)  # the cap is for all pods together
    files.write("ns", "a", "/tmp/one", b"z" * 900)  # a rewrite counts only its growth
    assert files.size == 900
    s = Session(stdin=[b"x" * 1500], files=files)
    assert s.run("tar", "-xmf", "-") == 1 and b"too large" in s.err

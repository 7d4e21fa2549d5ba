"""The commands a simulated pod runs for ``kubectl exec`` (and ``kubectl cp``, which is tar over exec).

A tiny built-in set, enough for clients to see real output, stdin, exit codes and files:
``echo``, ``cat``, ``true``/``false``, ``hostname``, ``env``, ``sleep``, ``test -d|-f|-e``,
``ls``, ``tar cf - PATH`` / ``tar -xmf - [-C DIR]``, and ``sh -c`` with ``;``, ``&&``,
``exit N`` and ``>&2``. Files written into a pod live in memory (``PodFiles``, bounded).
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import shlex
import tarfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: Directories every simulated container has.
_DIRS = frozenset({"/", "/tmp", "/etc", "/var", "/root", "/home", "/usr", "/bin"})
#: Bytes all simulated pods may hold in files together (kubectl cp into them).
MAX_FILE_BYTES = 64 << 20


class NotFound(Exception):
    """The executable does not exist: the runtime fails the exec itself (not an exit code)."""


@dataclass
class PodFiles:
    """Files in simulated pods, by (namespace, pod), in memory; a cap on their total size."""

    files: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    size: int = 0

    def of(self, namespace: str, pod: str) -> dict[str, bytes]:
        return self.files.setdefault((namespace, pod), {})

    def write(self, namespace: str, pod: str, path: str, data: bytes) -> None:
        files = self.of(namespace, pod)
        grown = len(data) - len(files.get(path, b""))
        if self.size + grown > MAX_FILE_BYTES:
            raise OSError(f"no space left on device (the simulated pods hold {MAX_FILE_BYTES >> 20} MiB)")
        files[path] = data
        self.size += grown


@dataclass
class Process:
    """One command's view of the exec session: its pod, streams and files."""

    namespace: str
    pod: str
    files: PodFiles
    read_stdin: Callable[[], Awaitable[bytes | None]]  # None at end of input
    write_stdout: Callable[[bytes], Awaitable[None]]
    write_stderr: Callable[[bytes], Awaitable[None]]

    @property
    def fs(self) -> dict[str, bytes]:
        return self.files.of(self.namespace, self.pod)

    def is_dir(self, path: str) -> bool:
        path = posixpath.normpath(path)
        prefix = path.rstrip("/") + "/"
        return path in _DIRS or any(name.startswith(prefix) for name in self.fs)

    async def stdin_all(self) -> bytes:
        chunks = []
        size = 0
        while (chunk := await self.read_stdin()) is not None:
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise OSError("input too large for the simulated pod")
        return b"".join(chunks)


async def run(argv: list[str], proc: Process) -> int:
    """Run one command; returns its exit code. Raises NotFound for an unknown executable."""
    if not argv:
        raise NotFound("")
    name, args = posixpath.basename(argv[0]), argv[1:]
    command = _COMMANDS.get(name)
    if command is None:
        raise NotFound(argv[0])
    try:
        return await command(args, proc)
    except OSError as e:
        await proc.write_stderr(f"{name}: {e}\n".encode())
        return 1


async def _echo(args: list[str], proc: Process) -> int:
    newline = True
    if args[:1] == ["-n"]:
        newline, args = False, args[1:]
    await proc.write_stdout((" ".join(args) + ("\n" if newline else "")).encode())
    return 0


async def _cat(args: list[str], proc: Process) -> int:
    if not args or args == ["-"]:
        while (chunk := await proc.read_stdin()) is not None:
            await proc.write_stdout(chunk)
        return 0
    status = 0
    for path in args:
        data = proc.fs.get(posixpath.normpath(path))
        if data is None:
            await proc.write_stderr(f"cat: {path}: No such file or directory\n".encode())
            status = 1
        else:
            await proc.write_stdout(data)
    return status


async def _true(args: list[str], proc: Process) -> int:
    return 0


async def _false(args: list[str], proc: Process) -> int:
    return 1


async def _hostname(args: list[str], proc: Process) -> int:
    await proc.write_stdout(f"{proc.pod}\n".encode())
    return 0


async def _env(args: list[str], proc: Process) -> int:
    await proc.write_stdout(f"HOSTNAME={proc.pod}\nPOD_NAMESPACE={proc.namespace}\nHOME=/root\n".encode())
    return 0


async def _sleep(args: list[str], proc: Process) -> int:
    try:
        seconds = float(args[0])
    except (IndexError, ValueError):
        await proc.write_stderr(b"sleep: invalid time interval\n")
        return 1
    await asyncio.sleep(min(max(seconds, 0.0), 3600.0))
    return 0


async def _test(args: list[str], proc: Process) -> int:
    if len(args) != 2 or args[0] not in ("-d", "-f", "-e"):
        return 2
    path = posixpath.normpath(args[1])
    is_file, is_dir = path in proc.fs, proc.is_dir(path)
    return 0 if {"-d": is_dir, "-f": is_file, "-e": is_file or is_dir}[args[0]] else 1


async def _ls(args: list[str], proc: Process) -> int:
    path = posixpath.normpath(args[0] if args else "/")
    if path in proc.fs:
        await proc.write_stdout(f"{path}\n".encode())
        return 0
    if not proc.is_dir(path):
        await proc.write_stderr(f"ls: {path}: No such file or directory\n".encode())
        return 1
    prefix = path.rstrip("/") + "/"
    names = sorted({name[len(prefix) :].split("/", 1)[0] for name in proc.fs if name.startswith(prefix)})
    await proc.write_stdout("".join(f"{n}\n" for n in names).encode())
    return 0


async def _tar(args: list[str], proc: Process) -> int:
    """``tar cf - PATH`` and ``tar [--no-same-*] -xmf - [-C DIR]``: what kubectl cp runs."""
    flags = [a for a in args if not a.startswith("--no-same-")]
    mode = flags[0].lstrip("-") if flags else ""
    if mode in ("cf", "c") and flags[1:2] == ["-"] and len(flags) >= 3:
        return await _tar_create(flags[2:], proc)
    if mode in ("xmf", "xf") and flags[1:2] == ["-"]:
        directory = "/"
        if flags[2:3] == ["-C"] and len(flags) >= 4:
            directory = flags[3]
        return await _tar_extract(directory, proc)
    await proc.write_stderr(b"tar: the simulated cluster knows only 'tar cf - PATH' and 'tar -xmf - [-C DIR]'\n")
    return 2


async def _tar_create(paths: list[str], proc: Process) -> int:
    out = io.BytesIO()
    status = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for raw in paths:
            path = posixpath.normpath(raw)
            prefix = path.rstrip("/") + "/"
            names = sorted(n for n in proc.fs if n == path or n.startswith(prefix))
            if not names:
                await proc.write_stderr(f"tar: {raw}: Cannot stat: No such file or directory\n".encode())
                status = 2
            for name in names:
                data = proc.fs[name]
                info = tarfile.TarInfo(name.lstrip("/"))  # GNU tar strips the leading slash
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    await proc.write_stdout(out.getvalue())
    return status


async def _tar_extract(directory: str, proc: Process) -> int:
    data = await proc.stdin_all()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                path = posixpath.normpath(posixpath.join("/", directory, member.name))
                if member.isfile():
                    extracted = tar.extractfile(member)
                    proc.files.write(proc.namespace, proc.pod, path, extracted.read() if extracted else b"")
    except tarfile.TarError as e:
        await proc.write_stderr(f"tar: {e}\n".encode())
        return 2
    return 0


async def _sh(args: list[str], proc: Process) -> int:
    """``sh -c SCRIPT``: commands joined by ``;`` or ``&&``, ``exit N``, ``>&2`` on a command."""
    if len(args) < 2 or args[0] != "-c":
        await proc.write_stderr(b"sh: the simulated cluster runs only 'sh -c SCRIPT'\n")
        return 2
    lexer = shlex.shlex(args[1], posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as e:
        await proc.write_stderr(f"sh: syntax error: {e}\n".encode())
        return 2
    status = 0
    command: list[str] = []
    skip = False  # after a failed `a &&`, until the next `;`
    for token in [*tokens, ";"]:
        if token not in (";", "&&"):
            command.append(token)
            continue
        if command and not skip:
            if command[0] == "exit":
                try:
                    return int(command[1]) & 0xFF if len(command) > 1 else status
                except ValueError:
                    return 2
            status = await _sh_one(command, proc)
        command = []
        skip = token == "&&" and (skip or status != 0)
    return status


async def _sh_one(command: list[str], proc: Process) -> int:
    """One simple command of a script, optionally with ``>&2``."""
    to_stderr = command[-2:] == [">&", "2"]
    if to_stderr:
        command = command[:-2]
    if not command or any(t and t[0] in "|&<>" for t in command):
        await proc.write_stderr(b"sh: pipes and redirections other than >&2 are not supported here\n")
        return 2
    sub = Process(
        proc.namespace,
        proc.pod,
        proc.files,
        proc.read_stdin,
        proc.write_stderr if to_stderr else proc.write_stdout,
        proc.write_stderr,
    )
    try:
        return await run(command, sub)
    except NotFound:
        await proc.write_stderr(f"sh: {command[0]}: not found\n".encode())
        return 127


_COMMANDS: dict[str, Callable[[list[str], Process], Awaitable[int]]] = {
    "echo": _echo,
    "cat": _cat,
    "true": _true,
    "false": _false,
    "hostname": _hostname,
    "env": _env,
    "sleep": _sleep,
    "test": _test,
    "ls": _ls,
    "tar": _tar,
    "sh": _sh,
}

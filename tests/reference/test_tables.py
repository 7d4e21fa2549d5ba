"""Tables (kubectl's output) through watchcache against kube-apiserver's own, live (the reference tier).

The scenario (``tests/printers/scenario.py``) makes objects of every kind the proxy prints, in the
states kube's printers tell apart, a CRD with printer columns (two versions) and one without, and
kinds kube prints with its default columns; kube-controller-manager rolls deployments, stateful
sets and daemon sets out (a fake kubelet runs their pods), and they are caught mid-rollout. Then:

- the Table of each LIST, GET and ``v1beta1`` Table, under each ``includeObject``, from the proxy
  at the resourceVersion its cache is at (``resourceVersionMatch=Exact``: the same snapshot), equals
  kube's: column definitions, cells, conditions, row objects, list metadata;
- pages (``limit``/``continue``) carry the same rows;
- ``kubectl get`` prints the same bytes, with no flags, ``-o wide``, ``--show-labels`` and ``-L``;
- ``kubectl get -w`` prints the same lines for the same changes, and Table watches (initial events,
  bookmarks) carry the same frames;
- a CRD's new printer columns reach the proxy's Tables;
- nothing of it passed through: ``watchcache_passthrough_requests_total{reason=~"table.*"}`` stays 0.

Ages are printed when each server answers: a comparison is taken between two answers of kube's
that agree (direct, proxy, direct; retried when kube's own two differ), or, for a watch's events
(printed when each server sends them), with ages a second apart allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from harness.kube.kit import (
    DEFAULT_RESOURCES,
    Api,
    KubeEnv,
    Serving,
    needs_kube,
    start_proxy,
    wait_for,
    with_query,
    write_kubeconfig,
)
from harness.processes import Proc
from harness.tools import KUBECTL_INSTALL, require
from tests.printers.scenario import Scenario, Target, targets

pytestmark = [pytest.mark.reference, needs_kube]

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
# The kit is shared: names of this run's own (override to put them under an engineer's prefix).
PREFIX = f"{os.environ.get('WATCHCACHE_REFERENCE_PREFIX', 'reference-tables')}-{_WORKER}"
# Each xdist worker's scenario has a NodePort of its own (gw0: 30081, gw1: 30082; 30080 alone).
NODE_PORT = 30080 + (int(_WORKER[2:]) + 1 if _WORKER.startswith("gw") else 0)
TABLE = "application/json;as=Table;v={v};g=meta.k8s.io"
INCLUDES = ("Metadata", "None", "Object")


@dataclass
class Env:
    kube: KubeEnv
    api: Api  # the apiserver
    proxy: Api  # watchcache in front of it
    proc: Proc
    scenario: Scenario
    targets: dict[str, Target]
    kubeconfigs: dict[str, Path]
    kubectl: str
    home: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kube = KubeEnv.from_environ()
    if not kube.control_plane:
        pytest.skip("needs the kit's controller manager and scheduler (start.sh --control-plane)")
    root = tmp_path_factory.mktemp("tables")
    api = Api(kube.url, kube.token, kube.ca)
    scenario = Scenario(api, PREFIX, node_port=NODE_PORT)
    try:
        scenario.create()
    except BaseException:
        scenario.cleanup()  # its nodes left behind would take other tests' pods (the kit schedules)
        raise
    found = {t.name: t for t in targets(scenario)}
    resources = ",".join(
        [DEFAULT_RESOURCES, "secrets", "apps/v1/controllerrevisions", "rbac.authorization.k8s.io/v1/roles",
         *(found[n].resource_id for n in ("widgets", "widgets-v2", "plains"))]
    )  # fmt: skip
    serving = Serving.make(root)
    proc = start_proxy(kube, serving, "--workers", "2", resources=resources)
    proxy = Api(proc.url, kube.token, str(serving.ca.crt))
    kubeconfigs = {
        "direct": Path(kube.kubeconfig),
        "proxy": write_kubeconfig(root / "proxy.kubeconfig", proc.url, str(serving.ca.crt), kube.token),
    }
    try:
        yield Env(kube, api, proxy, proc, scenario, found, kubeconfigs, require("kubectl", KUBECTL_INSTALL), root)
    finally:
        proc.stop()
        proxy.close()
        scenario.cleanup(wait=False)
        api.close()


def table(api: Api, path: str, version: str = "v1") -> dict[str, Any]:
    for _ in range(50):
        status, _, body = api.raw("GET", path, accept=TABLE.format(v=version))
        if status != 429:  # a custom resource's storage in kube restarts when its CRD changes
            break
        time.sleep(0.2)
    assert status == 200, (api.url, path, status, body[:400])
    doc: dict[str, Any] = json.loads(body)
    return doc


def agreed(read: Callable[[], Any], direct: Callable[[], Any], what: str, attempts: int = 10) -> tuple[Any, Any]:
    """(kube's answer, the proxy's), the proxy's taken between two answers of kube's: it must be one of
    them (ages move on between them: a second boundary may fall either side of the proxy's answer)."""
    for _ in range(attempts):
        before = direct()
        ours = read()
        after = direct()
        if ours == before or before == after:
            return before, ours
        if ours == after:
            return after, ours
    raise AssertionError(f"{what}: kube's own answers kept changing, and the proxy's was neither")


def query(target: Target, **params: Any) -> str:
    return with_query(target.path, **dict(target.query), **params)


def cached_rv(env: Env, target: Target) -> str:
    """The rv of the proxy's cache of ``target``'s kind (its ``resourceVersion=0`` LIST), which kube, whose
    cache feeds it, holds too: both answer an Exact read there at once. Not a consistent LIST's: while
    other tests write, kube's waits for its cache's progress, and the proxy's Exact read at that rv for a
    bookmark that proves it has every change up to it (~1 s a read in ``make test``; the Exact reads
    are what is compared)."""
    rv: str = table(env.proxy, query(target, resourceVersion="0"))["metadata"]["resourceVersion"]
    return rv


@pytest.mark.parametrize("include", INCLUDES)
@pytest.mark.parametrize("name", [t.name for t in targets(Scenario(None, PREFIX))])  # type: ignore[arg-type]
def test_list_tables_equal_kubes(env: Env, name: str, include: str) -> None:
    target = env.targets[name]
    rv = cached_rv(env, target)
    path = query(target, includeObject=include, resourceVersion=rv, resourceVersionMatch="Exact")
    kube, ours = agreed(lambda: table(env.proxy, path), lambda: table(env.api, path), f"{name} {include}")
    assert ours["columnDefinitions"] == kube["columnDefinitions"]
    assert ours == kube


@pytest.mark.parametrize("name", [t.name for t in targets(Scenario(None, PREFIX))])  # type: ignore[arg-type]
def test_get_and_v1beta1_tables_equal_kubes(env: Env, name: str) -> None:
    target = env.targets[name]
    listed = table(env.proxy, query(target, resourceVersion="0"))
    rv = listed["metadata"]["resourceVersion"]
    path = query(target, resourceVersion=rv, resourceVersionMatch="Exact")
    kube, ours = agreed(lambda: table(env.proxy, path, "v1beta1"), lambda: table(env.api, path, "v1beta1"), name)
    assert ours == kube
    for row in (listed["rows"] or [])[:3]:
        path = f"{target.path}/{row['object']['metadata']['name']}"
        kube, ours = agreed(lambda p=path: table(env.proxy, p), lambda p=path: table(env.api, p), path)
        # a GET is a consistent read: each server's newest state, which agree when the object is quiet
        if kube["metadata"]["resourceVersion"] == ours["metadata"]["resourceVersion"]:
            assert ours == kube


@pytest.mark.parametrize("name", ["pods", "configmaps", "widgets"])
def test_pages_carry_kubes_rows(env: Env, name: str) -> None:
    target = env.targets[name]

    def pages(api: Api) -> list[tuple[list[Any], bool]]:
        out = []
        token = ""
        while True:
            doc = table(api, query(target, limit=3, **({"continue": token} if token else {}), includeObject="None"))
            token = doc["metadata"].get("continue", "")
            out.append(([r["cells"][0] for r in doc["rows"]], bool(token)))
            if not token:
                return out

    kube, ours = agreed(lambda: pages(env.proxy), lambda: pages(env.api), f"{name} pages")
    assert ours == kube and len(kube) > 1


# ----------------------------------------------------------------------------------------- kubectl


def kubectl(env: Env, where: str, *args: str) -> tuple[str, str]:
    result = subprocess.run(
        [env.kubectl, "--kubeconfig", str(env.kubeconfigs[where]), "--cache-dir", str(env.home / f"cache-{where}"),
         *args],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": str(env.home)},
    )  # fmt: skip
    assert result.returncode == 0, (where, args, result.stderr)
    return result.stdout, result.stderr


def get_args(env: Env, target: Target) -> list[str]:
    resource = f"{target.resource}.{target.version}.{target.group}" if target.group else target.resource
    args = ["get", resource]
    if target.namespaced:
        args += ["-n", env.scenario.ns]
    args += [f"-l={value}" for key, value in target.query if key == "labelSelector"]
    return args


FLAGS = {"default": [], "wide": ["-o", "wide"], "labels": ["--show-labels"], "columns": ["-L", "app,state"]}


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("name", [t.name for t in targets(Scenario(None, PREFIX))])  # type: ignore[arg-type]
def test_kubectl_get_prints_kubes_bytes(env: Env, name: str, flags: str) -> None:
    args = [*get_args(env, env.targets[name]), *FLAGS[flags]]

    # stderr too: kube's deprecation warning of v1 Endpoints, printed by kubectl, comes from the proxy's cache
    kube, ours = agreed(lambda: kubectl(env, "proxy", *args), lambda: kubectl(env, "direct", *args), " ".join(args))
    assert ours == kube


@pytest.mark.parametrize(
    "query",
    [
        "resourceVersion=0",
        "resourceVersion=0&limit=2",
        "resourceVersion=0&labelSelector=a+b",
        "watch=1&resourceVersion=0&timeoutSeconds=1",
    ],
)
@pytest.mark.parametrize("kind", ["endpoints", "endpointslices", "pods"])
def test_deprecation_warnings_are_kubes(env: Env, kind: str, query: str) -> None:
    """The Warning header of cached reads (v1 Endpoints: deprecated in v1.33) equals kube's, errors included."""
    group = "discovery.k8s.io" if kind == "endpointslices" else ""
    collection = env.scenario.path(kind, group)
    before = _passed_through(env)
    for path in (
        f"{collection}?{query}",
        f"{collection}/many?resourceVersion=0",
        f"{collection}/nope?resourceVersion=0",
    ):
        if "watch" in query and path != f"{collection}?{query}":
            continue
        kube = env.api.raw("GET", path)
        ours = env.proxy.raw("GET", path)
        assert (ours[0], ours[1].get("warning")) == (kube[0], kube[1].get("warning")), path
    assert _passed_through(env) == before  # the proxy's own answers


def _passed_through(env: Env) -> float:
    status, _, body = env.proxy.raw("GET", "/metrics", accept=None)
    assert status == 200
    pattern = r"^watchcache_passthrough_requests_total\{[^}]*\} (\S+)$"
    return sum(float(m.group(1)) for m in re.finditer(pattern, body.decode(), re.M))


_AGE = re.compile(r"^(?:(\d+)y)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def _seconds(token: str) -> int | None:
    m = _AGE.match(token.strip("()"))
    if m is None or not token.strip("()") or not any(m.groups()):
        return None
    y, d, h, mi, s = (int(g or 0) for g in m.groups())
    return (((y * 365 + d) * 24 + h) * 60 + mi) * 60 + s


def same_line_but_ages(a: str, b: str, slack: int = 1) -> bool:
    """Equal, or differing only in ages ``slack`` seconds apart (or one unit of a coarser precision)."""
    if a == b:
        return True
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x == y:
            continue
        sx, sy = _seconds(x), _seconds(y)
        if sx is None or sy is None:
            return False
        unit = slack if x.rstrip(")").endswith("s") and y.rstrip(")").endswith("s") else 60
        if abs(sx - sy) > unit:
            return False
    return True


def _read_lines(stream: IO[str], into: list[str]) -> None:
    """Each line as it comes (the test polls ``len(into)``), until the process ends."""
    for line in stream:
        into.append(line)


def test_kubectl_get_watch_prints_kubes_lines(env: Env) -> None:
    ns = env.scenario.ns
    procs: dict[tuple[str, str], subprocess.Popen[str]] = {}
    lines: dict[tuple[str, str], list[str]] = {}
    readers = []
    for where in ("direct", "proxy"):
        for kind in ("pods", "configmaps"):
            argv = [env.kubectl, "--kubeconfig", str(env.kubeconfigs[where]), "get", kind, "-n", ns, "-w", "-o", "wide"]
            proc = procs[where, kind] = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            out = lines[where, kind] = []
            assert proc.stdout is not None
            readers.append(threading.Thread(target=_read_lines, args=(proc.stdout, out), daemon=True))
            readers[-1].start()
    errors = {}
    try:
        # Each kubectl has printed its LIST: its watch starts from that LIST's rv, so every write below
        # comes to it as an event, however late the watch itself is registered (not a fixed sleep: four
        # kubectl processes took over 3 s to get there under make test's three workers).
        wait_for(lambda: all(lines.values()), 60, "every kubectl printed its list")
        cms = env.scenario.path("configmaps")
        pods = env.scenario.path("pods")
        for i in range(3):
            env.api.create(cms, {"metadata": {"name": f"watched-{i}"}, "data": {"a": "1"}})
            env.api.merge_patch(f"{cms}/watched-{i}", {"data": {"b": "2"}})
        env.api.merge_patch(f"{pods}/running/status", {"status": {"containerStatuses": [{
            "name": "app", "image": "x", "imageID": "", "ready": False, "restartCount": 1, "started": True,
            "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}},
            "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-01-01T00:00:00Z"}}}]}})  # fmt: skip
        env.api.create(pods, {"metadata": {"name": "watched"}, "spec": {
            "containers": [{"name": "c", "image": "x"}], "nodeSelector": {"example.com/nowhere": "x"}}})  # fmt: skip
        env.api.delete(f"{pods}/watched", gracePeriodSeconds=0)
        for i in range(3):
            env.api.delete(f"{cms}/watched-{i}")
        # Until both print as many lines, past the least kube prints, and no more come for a second
        # (kube's controllers may still touch the scenario's pods: each server prints those too).
        settled: dict[str, tuple[int, float]] = {}

        def printed_alike() -> bool:
            for kind, least in (("pods", 25), ("configmaps", 12)):
                n = len(lines["direct", kind])
                if n < least or len(lines["proxy", kind]) != n:
                    return False
                if settled.get(kind, (-1, 0.0))[0] != n:
                    settled[kind] = (n, time.monotonic())
            return all(time.monotonic() - since >= 1.0 for _, since in settled.values())

        wait_for(printed_alike, 60, "kubectl printed the same number of lines through the proxy and direct")
    finally:
        for key, proc in procs.items():
            proc.terminate()
            errors[key] = proc.communicate(timeout=10)[1]
        for reader in readers:
            reader.join(10)
    for kind in ("pods", "configmaps"):
        direct, ours = (
            [line.rstrip("\n") for line in lines["direct", kind]],
            [line.rstrip("\n") for line in lines["proxy", kind]],
        )
        assert len(ours) == len(direct), (kind, errors["proxy", kind], ours, len(direct))
        for a, b in zip(direct, ours, strict=True):
            assert same_line_but_ages(a, b, slack=3), (a, b)


def read_frames(
    api: Api, path: str, seconds: float, seen: threading.Event | None = None, last: str | None = None
) -> list[dict[str, Any]]:
    """A Table watch's frames until the server ends it, or through the first of type ``last``; ``seen`` is
    set at the initial-events-end bookmark."""
    frames: list[dict[str, Any]] = []
    conn = api.connect(seconds + 10)
    try:
        conn.request("GET", path, headers=api.headers(TABLE.format(v="v1")))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        while line := resp.readline():
            frames.append(json.loads(line))
            if seen is not None and frames[-1]["type"] == "BOOKMARK" and _initial_end(frames[-1]):
                seen.set()
            if frames[-1]["type"] == last:
                break
    finally:
        conn.close()
    return frames


@pytest.mark.parametrize("include", INCLUDES)
def test_table_watch_frames_equal_kubes(env: Env, include: str) -> None:
    """Initial events (the columns in the first only), the initial-events-end bookmark, then changes."""
    cms = env.scenario.path("configmaps")
    rv = env.api.get(cms)["metadata"]["resourceVersion"]
    path = with_query(cms, watch=1, sendInitialEvents=True, allowWatchBookmarks=True, includeObject=include,
                      resourceVersionMatch="NotOlderThan", resourceVersion=rv, timeoutSeconds=8)  # fmt: skip
    got: dict[str, list[dict[str, Any]]] = {}
    seen = {"direct": threading.Event(), "proxy": threading.Event()}
    threads = [
        # Through the DELETED of the ConfigMap written below: the last change (not the watch's 8 s end).
        threading.Thread(
            target=lambda w=where, a=api: got.__setitem__(w, read_frames(a, path, 8, seen[w], last="DELETED"))
        )
        for where, api in (("direct", env.api), ("proxy", env.proxy))
    ]
    for t in threads:
        t.start()
    assert all(e.wait(8) for e in seen.values()), "initial events"
    env.api.create(cms, {"metadata": {"name": f"framed-{include.lower()}"}, "data": {"x": "y"}})
    env.api.delete(f"{cms}/framed-{include.lower()}")
    for t in threads:
        t.join(20)
    # kube sends periodic bookmarks on its own schedule; compare the rest
    direct = [f for f in got["direct"] if f["type"] != "BOOKMARK" or _initial_end(f)]
    ours = [f for f in got["proxy"] if f["type"] != "BOOKMARK" or _initial_end(f)]
    assert [f["type"] for f in ours] == [f["type"] for f in direct], (got["direct"], got["proxy"])
    for frames in (direct, ours):
        # The initial-events-end bookmark's rv is each server's cache's at that moment: at least the rv
        # asked and before the changes that follow, but not the same one where the cluster writes
        # elsewhere (the control plane's Leases: kube's cache moves on etcd's progress notifications).
        ends = [int(f["object"]["metadata"].pop("resourceVersion")) for f in frames if f["type"] == "BOOKMARK"]
        for f in frames:
            # includeObject=Object: the bookmark's row carries the bookmark itself, at the same rv.
            for row in f["object"].get("rows") or () if f["type"] == "BOOKMARK" else ():
                meta = (row.get("object") or {}).get("metadata") or {}
                if "resourceVersion" in meta:
                    assert int(meta.pop("resourceVersion")) in ends, (meta, ends)
        after = [_row_rv(f) for f in frames[frames.index(next(f for f in frames if f["type"] == "BOOKMARK")) :]]
        assert len(ends) == 1 and int(rv) <= ends[0] < min([r for r in after if r] or [ends[0] + 1]), (ends, rv, after)
    for a, b in zip(direct, ours, strict=True):
        rows_a, rows_b = a["object"].pop("rows"), b["object"].pop("rows")
        assert b == a
        for ra, rb in zip(rows_a, rows_b, strict=True):
            assert rb["object"] == ra["object"]
            # the proxy's initial events may start later: it first proves its cache as new as the rv asked
            assert same_line_but_ages(" ".join(map(str, ra["cells"])), " ".join(map(str, rb["cells"])), slack=5)


def _row_rv(frame: dict[str, Any]) -> int:
    """The rv of a change frame's object (0: none, as with includeObject=None, or a bookmark)."""
    rows = frame["object"].get("rows") or [{}]
    meta = (rows[0].get("object") or {}).get("metadata") or {}
    return 0 if frame["type"] == "BOOKMARK" else int(meta.get("resourceVersion") or 0)


def _initial_end(frame: dict[str, Any]) -> bool:
    rows = frame["object"].get("rows") or [{}]
    meta = (rows[0].get("object") or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get("k8s.io/initial-events-end") == "true"


def test_new_printer_columns_reach_the_proxy(env: Env) -> None:
    target = env.targets["widgets"]
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{env.scenario.crd_names()[0]}"
    crd = env.api.get(crd_path)
    crd["spec"]["versions"][0]["additionalPrinterColumns"].insert(
        0, {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "added later"}
    )
    env.api.call("PUT", crd_path, crd)

    def caught_up() -> bool:
        kube = table(env.api, query(target, includeObject="None"))
        ours = table(env.proxy, query(target, includeObject="None"))
        return bool(ours["columnDefinitions"] == kube["columnDefinitions"] and kube["columnDefinitions"][1]["name"]
                    == "Phase")  # fmt: skip

    wait_for(caught_up, 30, "the CRD's new column in the proxy's Table")
    path = query(target, includeObject="None")
    kube, ours = agreed(lambda: table(env.proxy, path), lambda: table(env.api, path), "widgets after the update")
    assert [r["cells"] for r in ours["rows"]] == [r["cells"] for r in kube["rows"]]


def test_zz_nothing_passed_through(env: Env) -> None:
    """Last in this module (by name): every Table above came from the cache."""
    status, _, body = env.proxy.raw("GET", "/metrics", accept=None)
    assert status == 200
    counts = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^watchcache_passthrough_requests_total\{[^}]*reason="(table[^"]*)"[^}]*\} (\S+)$', body.decode(), re.M
        )
    }
    assert counts and all(v == 0 for v in counts.values()), counts

"""Record kube-apiserver's Tables of the scenario's objects: the suite tier's fixtures.

Run once against the reference kit (shared/tools/kube-reference, with ``--control-plane``)::

    eval "$(../shared/tools/kube-reference/env.sh)"
    .venv/bin/python -m tests.printers.capture            # writes tests/printers/fixtures/*.json

For each kind (``scenario.targets``): the LIST as a Table with ``includeObject=Object`` (its rows
carry the objects, the printers' input), then with ``None`` and ``Metadata`` at the same
resourceVersion (``resourceVersionMatch=Exact``: the same snapshot), a GET of its first object,
and a ``meta.k8s.io/v1beta1`` Table; each with the wall-clock time before the request and after
the answer, the bounds of the time kube's ages were printed at. And watches of configmaps:
initial events with their end bookmark, then changes, as Tables (the columns in the first event
only). The scenario's objects are removed at the end.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.kube.kit import Api, KubeEnv, with_query
from tests.printers.scenario import Scenario, Target, targets

FIXTURES = Path(__file__).parent / "fixtures"
TABLE = "application/json;as=Table;v={v};g=meta.k8s.io"


def timed_get(api: Api, path: str, accept: str) -> dict[str, Any]:
    sent = time.time_ns()
    status, _, body = api.raw("GET", path, accept=accept)
    received = time.time_ns()
    assert status == 200, (path, status, body[:300])
    return {"path": path, "accept": accept, "sent": sent, "received": received, "body": json.loads(body)}


def capture_target(api: Api, target: Target) -> dict[str, Any]:
    query = dict(target.query)
    accept = TABLE.format(v="v1")
    first = timed_get(api, with_query(target.path, includeObject="Object", **query), accept)
    rv = first["body"]["metadata"]["resourceVersion"]
    record: dict[str, Any] = {
        "target": target.__dict__,
        "lists": {"Object": first},
    }
    for include in ("None", "Metadata"):
        path = with_query(target.path, includeObject=include, resourceVersion=rv, resourceVersionMatch="Exact", **query)
        record["lists"][include] = timed_get(api, path, accept)
    rows = first["body"]["rows"] or []
    if rows:
        name = rows[0]["object"]["metadata"]["name"]
        record["get"] = timed_get(api, f"{target.path}/{name}", accept)
    path = with_query(target.path, resourceVersion=rv, resourceVersionMatch="Exact", **query)
    record["v1beta1"] = timed_get(api, path, TABLE.format(v="v1beta1"))
    return record


def read_watch(api: Api, path: str, accept: str, frames: list[dict[str, Any]], stop: threading.Event) -> None:
    conn = api.connect(60)
    try:
        conn.request("GET", path, headers=api.headers(accept))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        while not stop.is_set():
            line = resp.readline()
            if not line:
                return
            frames.append({"at": time.time_ns(), "event": json.loads(line)})
    finally:
        conn.close()


def capture_watches(api: Api, s: Scenario) -> dict[str, Any]:
    cms = s.path("configmaps")
    accept = TABLE.format(v="v1")
    rv = api.get(cms)["metadata"]["resourceVersion"]
    out: dict[str, Any] = {"start_rv": rv, "watches": {}}
    stop = threading.Event()
    threads = []
    for include in ("Object", "None"):
        frames: list[dict[str, Any]] = []
        path = with_query(cms, watch=1, resourceVersion=rv, includeObject=include, timeoutSeconds=20)
        out["watches"][include] = {"path": path, "frames": frames}
        threads.append(threading.Thread(target=read_watch, args=(api, path, accept, frames, stop)))
    for t in threads:
        t.start()
    time.sleep(1)
    api.create(cms, {"metadata": {"name": "w1"}, "data": {"a": "1"}})
    api.merge_patch(f"{cms}/w1", {"data": {"b": "2"}})
    api.create(cms, {"metadata": {"name": "w2"}, "binaryData": {"x": "AA=="}})
    api.delete(f"{cms}/w1")
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(25)
    # initial events, with their end bookmark, as PartialObjectMetadata rows; and the objects then
    listed = timed_get(api, with_query(cms, includeObject="Object"), accept)
    frames = []
    rv = listed["body"]["metadata"]["resourceVersion"]
    path = with_query(cms, watch=1, sendInitialEvents=True, allowWatchBookmarks=True, includeObject="Metadata",
                      resourceVersionMatch="NotOlderThan", resourceVersion=rv, timeoutSeconds=3)  # fmt: skip
    read_watch(api, path, accept, frames, threading.Event())
    out["initial"] = {"path": path, "frames": frames, "objects": listed}
    return out


def main() -> int:
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    s = Scenario(api, "i23-tables")
    FIXTURES.mkdir(exist_ok=True)
    try:
        s.create(control_plane=kube.control_plane)
        time.sleep(2)
        for target in targets(s):
            record = capture_target(api, target)
            (FIXTURES / f"{target.name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            print(f"{target.name}: {len(record['lists']['Object']['body']['rows'] or [])} rows", flush=True)
        (FIXTURES / "watch.json").write_text(json.dumps(capture_watches(api, s), indent=1, sort_keys=True) + "\n")
        print("watch: recorded", flush=True)
    finally:
        s.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

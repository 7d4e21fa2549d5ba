"""An on-demand kind read only in protobuf costs one upstream watch, against kube-apiserver v1.36.

``limitranges`` is not in ``--resources``: a JSON read starts its cache (on demand, ``service/ondemand.py``);
then only protobuf clients read it (kube's components do). Its JSON feed is suspended after
``--encoding-idle-timeout`` as a configured kind's is (``upstream/encodings.py``), so the upstream
sees the protobuf cache's watch only; a JSON read resumes the feed and is answered from the cache.
Before on-demand reflectors were registered with ``JsonFeeds``, such a kind kept both watches.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.kube.kit import Api, KubeEnv, Serving, needs_kube, start_proxy, wait_for

pytestmark = needs_kube

PB = "application/vnd.kubernetes.protobuf"
LIMITRANGES = "/api/v1/limitranges"


def debug(api: Api) -> dict[str, Any]:
    resources: dict[str, Any] = api.get("/debug/cache")["resources"]
    return resources.get("limitranges", {})


def test_an_on_demand_kinds_json_feed_is_suspended_while_only_protobuf_clients_read_it(tmp_path: Path) -> None:
    kube = KubeEnv.from_environ()
    serving = Serving.make(tmp_path)
    proc = start_proxy(kube, serving, "--workers", "1", "--encoding-idle-timeout", "1", resources="configmaps")
    api = Api(proc.url, kube.token, str(serving.ca.crt))
    try:

        def json_read() -> bool:  # the first starts the kind's cache
            assert api.raw("GET", LIMITRANGES + "?resourceVersion=0")[0] == 200
            return debug(api).get("ready") is True

        wait_for(json_read, 30, "the on-demand JSON cache of limitranges", interval=0.2)

        def protobuf_only() -> bool:
            status, headers, _ = api.raw("GET", LIMITRANGES + "?resourceVersion=0", accept=PB)
            assert status == 200 and headers["content-type"].startswith(PB), (status, headers)
            time.sleep(0.2)
            return debug(api).get("state") == "suspended"

        wait_for(protobuf_only, 30, "the JSON feed of limitranges suspended")
        assert any("JSON feed of limitranges: suspended" in line for line in proc.log)
        assert debug(api)["protobuf"]["ready"] is True

        status, headers, body = api.raw("GET", LIMITRANGES + "?resourceVersion=0")
        assert status == 200 and headers["content-type"].startswith("application/json")
        assert json.loads(body)["kind"] == "LimitRangeList"
        assert debug(api)["state"] == "ready"
        assert api.raw("GET", "/readyz", accept=None)[0] == 200
    finally:
        api.close()
        proc.stop()

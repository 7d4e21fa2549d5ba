"""Write ``watchcache/cache/zeros.py`` from the reference kit's own bookmarks.

For every list-watchable kind of every served version of a group kube-apiserver serves itself, one
watch-list that selects nothing: its first frame is the initial-events-end bookmark, the kind's empty
object. What follows its metadata is the kind's zero-valued fields, kept as bytes.

Run: ``eval "$(../shared/tools/kube-reference/env.sh)"; .venv/bin/python -m harness.kube.zeros``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.kube.kit import Api, KubeEnv
from watchcache.resources import BUILTIN_GROUPS

TARGET = Path(__file__).resolve().parents[2] / "watchcache" / "cache" / "zeros.py"
_WATCH_LIST = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
    "labelSelector": "watchcache-zeros=none",
    "timeoutSeconds": "1",
}


def _versions(api: Api) -> list[tuple[str, str]]:
    out = [("", v) for v in api.get("/api")["versions"]]
    for group in api.get("/apis")["groups"]:
        if group["name"] in BUILTIN_GROUPS:
            out.extend((group["name"], v["version"]) for v in group["versions"])
    return out


def tails(api: Api) -> dict[tuple[str, str, str], bytes]:
    found: dict[tuple[str, str, str], bytes] = {}
    for group, version in _versions(api):
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        for resource in api.get(base)["resources"]:
            if "/" in resource["name"] or not {"list", "watch"} <= set(resource["verbs"]):
                continue
            query = "&".join(f"{k}={v}" for k, v in _WATCH_LIST.items())
            status, _, body = api.raw("GET", f"{base}/{resource['name']}?{query}")
            if status != 200:
                print(f"skipped {base}/{resource['name']}: {status}", file=sys.stderr)
                continue
            event = json.loads(body.split(b"\n")[0])
            assert event["type"] == "BOOKMARK", event
            rest = {k: v for k, v in event["object"].items() if k not in ("apiVersion", "kind", "metadata")}
            if rest:  # Go's encoding of these zero values: no HTML to escape, no float
                found[group, version, resource["kind"]] = b"," + json.dumps(rest, separators=(",", ":")).encode()[1:-1]
    return found


def main() -> None:
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    # The module's text up to its table stays as it is: only the entries are the apiserver's.
    text = TARGET.read_text()
    head = text[: text.index("\n", text.index("BOOKMARK_TAILS:")) + 1]
    lines = [head]
    for key, tail in sorted(tails(api).items()):
        lines.append(f"    ({', '.join(json.dumps(k) for k in key)}): {tail!r},\n")
    lines.append("}\n# fmt: on\n")
    TARGET.write_text("".join(lines))
    print(f"{TARGET}: {len(lines) - 2} kinds", file=sys.stderr)


if __name__ == "__main__":
    main()

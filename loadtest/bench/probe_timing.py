"""When does a consistent-read probe get its bookmark? (docs/consistency.md)

N times, at a random moment: a consistent ``limit=1`` LIST of ConfigMaps (for the current rv ``R``),
then a watch from ``R - 3`` with ``allowWatchBookmarks=true&timeoutSeconds=T``, timed until its
first BOOKMARK. kube-apiserver sends it 2 s before the deadline, in whole-second buckets, at the
next tick of a 1–1.25 s timer: 0–2.25 s after the start for ``T=3``, never for ``T=2``.

Run: ``.venv/bin/python -m loadtest.bench.probe_timing URL [-n 30] [-t 3]`` — ``URL`` a ``watchcache sim``
(with ``--churn`` so the rv moves), or ``$KUBE_REFERENCE_URL`` (with ``KUBE_REFERENCE_TOKEN`` and
``KUBE_REFERENCE_CA`` from ``/work/shared/tools/kube-reference/env.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import time

import aiohttp


async def main(args: argparse.Namespace) -> None:
    token = os.environ.get("KUBE_REFERENCE_TOKEN") if args.url.startswith("https") else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tls: ssl.SSLContext | bool = False
    if args.url.startswith("https"):
        tls = ssl.create_default_context(cafile=os.environ.get("KUBE_REFERENCE_CA"))
    delays: list[float | None] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as s:
        for _ in range(args.n):
            await asyncio.sleep(random.uniform(0, 1.3))
            async with s.get(args.url + "/api/v1/configmaps", params={"limit": "1"}, headers=headers) as r:
                rv = int((await r.json())["metadata"]["resourceVersion"])
            params = {
                "watch": "1",
                "resourceVersion": str(rv - 3),
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(args.t),
            }
            t0 = time.monotonic()
            got = None
            async with s.get(args.url + "/api/v1/configmaps", params=params, headers=headers) as r:
                async for line in r.content:
                    if json.loads(line)["type"] == "BOOKMARK":
                        got = time.monotonic() - t0
                        break
            delays.append(got)
    seen = sorted(d for d in delays if d is not None)
    if not seen:
        print(f"no bookmark in {args.n} probes")
        return
    print(
        f"bookmarks {len(seen)}/{args.n}: min {seen[0]:.2f} s, p50 {seen[len(seen) // 2]:.2f} s, "
        f"max {seen[-1]:.2f} s, mean {sum(seen) / len(seen):.2f} s"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("-n", type=int, default=30, help="probes (default 30)")
    p.add_argument("-t", type=int, default=3, help="timeoutSeconds of each probe (default 3)")
    asyncio.run(main(p.parse_args()))

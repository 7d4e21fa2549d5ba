"""Reading kubectl's verbose (-v=6) log."""

from __future__ import annotations

import re

# kubectl -v=6 logs each request: ``GET URL 200 OK`` up to 1.32, ``verb="GET" url="URL" status="200 OK"`` since.
_POD_LIST = re.compile(r'GET (\S+)/api/v1/pods\?(\S+) 200|verb="GET" url="([^"]+)/api/v1/pods\?([^"]+)" status="200')


def pods_requests(log: str) -> list[tuple[str, str]]:
    """(server, query) of each successful pod LIST in kubectl's -v=6 log."""
    return [(m[0] or m[2], m[1] or m[3]) for m in _POD_LIST.findall(log)]

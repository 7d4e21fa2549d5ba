"""The load test's own command-line options, and the frozen settings the users read.

Locust parses them with its own flags (``locust -f loadtest/locustfile.py --help`` lists them
under "Custom arguments"); each also reads a ``WATCHCACHE_LT_*`` environment variable.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

PROFILES = ("steady", "ramp", "relist-storm", "fanout")


def add_arguments(parser: Any) -> None:
    """Register the custom flags on locust's (configargparse) parser."""
    # On the parser itself, not a group: only LocustArgumentParser.add_argument takes is_secret.
    parser.add_argument(
        "--load-profile",
        choices=PROFILES,
        default="steady",
        env_var="WATCHCACHE_LT_PROFILE",
        help="load shape: steady (fixed mix), ramp (watchers ramp to --users), relist-storm (informers "
        "restart at once), fanout (many watchers of one churning namespace). Default %(default)s",
    )
    parser.add_argument(
        "--token",
        default="",
        env_var="WATCHCACHE_LT_TOKEN",
        is_secret=True,
        help="bearer token sent with every request (to the proxy, which passes it through, or to an apiserver)",
    )
    parser.add_argument(
        "--upstream-host",
        default="",
        env_var="WATCHCACHE_LT_UPSTREAM_HOST",
        help="the proxy's upstream, e.g. http://127.0.0.1:8081: read for its /debug/cache request counts, "
        "and the target of writes with --writes-via upstream",
    )
    parser.add_argument(
        "--writes-via",
        choices=("proxy", "upstream"),
        default="proxy",
        env_var="WATCHCACHE_LT_WRITES_VIA",
        help="ChurnUser writes through the target (pass-through) or straight to --upstream-host. Default %(default)s",
    )
    parser.add_argument(
        "--namespaces",
        default="",
        env_var="WATCHCACHE_LT_NAMESPACES",
        help="comma-separated namespaces to read (default: the ns-* namespaces found, else all)",
    )
    parser.add_argument(
        "--churn-namespaces",
        default="",
        env_var="WATCHCACHE_LT_CHURN_NAMESPACES",
        help="comma-separated namespaces ChurnUser writes configmaps in (default: the first three read "
        "namespaces; fanout: the first one)",
    )
    parser.add_argument(
        "--churn-rate",
        type=float,
        default=10.0,
        env_var="WATCHCACHE_LT_CHURN_RATE",
        help="writes per second per ChurnUser (default %(default)s)",
    )
    parser.add_argument(
        "--watch-timeout",
        type=float,
        default=10.0,
        env_var="WATCHCACHE_LT_WATCH_TIMEOUT",
        help="watches ask for timeoutSeconds in [T, 2T), as client-go does with its 5-10 min; short so that a "
        "short run exercises resumption (default %(default)s)",
    )
    parser.add_argument(
        "--storm-at",
        type=float,
        default=0.4,
        env_var="WATCHCACHE_LT_STORM_AT",
        help="relist-storm: when all informers restart, as a fraction of the run time (default %(default)s)",
    )


@dataclass(frozen=True)
class Settings:
    profile: str
    token: str
    upstream_host: str
    writes_via: str
    namespaces: tuple[str, ...]  # resolved at test start, see ``resolve_namespaces``
    churn_namespaces: tuple[str, ...]
    churn_rate: float
    watch_timeout: float
    storm_at: float

    def headers(self, *, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    @property
    def write_base(self) -> str:
        """Prefix of write URLs: "" (the target, through the proxy) or the upstream's address."""
        if self.writes_via == "upstream":
            return self.upstream_host.rstrip("/")
        return ""


def split(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def settings_from(options: argparse.Namespace, found_namespaces: list[str]) -> Settings:
    namespaces = split(options.namespaces) or resolve_namespaces(found_namespaces)
    churn = split(options.churn_namespaces)
    if not churn:
        if not any(n.startswith("ns-") for n in namespaces):
            # Not the simulated cluster: never pick namespaces to write in on someone's real cluster.
            raise ValueError("pass --churn-namespaces: the namespaces ChurnUser may create configmaps in")
        churn = namespaces[: 1 if options.load_profile == "fanout" else 3]
    if options.writes_via == "upstream" and not options.upstream_host:
        raise ValueError("--writes-via upstream needs --upstream-host")
    if not namespaces:
        raise ValueError("no namespace to read: pass --namespaces")
    return Settings(
        profile=options.load_profile,
        token=options.token,
        upstream_host=options.upstream_host,
        writes_via=options.writes_via,
        namespaces=namespaces,
        churn_namespaces=churn,
        churn_rate=options.churn_rate,
        watch_timeout=options.watch_timeout,
        storm_at=options.storm_at,
    )


def resolve_namespaces(found: list[str]) -> tuple[str, ...]:
    """The simulated cluster's ns-0..ns-N-1 when present (its pods live there), else every namespace."""
    simulated = sorted((n for n in found if n.startswith("ns-") and n[3:].isdigit()), key=lambda n: int(n[3:]))
    return tuple(simulated or sorted(found))

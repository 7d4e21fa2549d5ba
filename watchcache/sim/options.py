"""The simulated cluster's options: what ``watchcache sim`` and the embedded mode of ``serve`` build."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class SimOptions:
    objects: int = 0
    namespaces: int = 1
    nodes: int = 10
    churn: float = 0.0
    seed: int = 0
    state_file: str | None = None
    # Users, tokens and RBAC-like rules: the sim then answers TokenReview/SubjectAccessReview and
    # enforces the policy on its own API, as an apiserver does.
    policy_file: str | None = None
    # Believe X-Remote-* headers over a client certificate from this CA (with one of these CNs,
    # if any), as an apiserver's --requestheader-client-ca-file / --requestheader-allowed-names.
    requestheader_ca_file: str | None = None
    requestheader_allowed_names: tuple[str, ...] = ()
    # With a policy: requests without credentials are anonymous (else 401), as kube's --anonymous-auth.
    anonymous: bool = True
    # Serve CustomResourceDefinitions and the kinds they define (``watchcache sim --crds``: sim/crds.py).
    crds: bool = False
    # Serve flowcontrol.apiserver.k8s.io/v1, seeded with kube's suggested objects (``watchcache sim --flowcontrol``).
    flowcontrol: bool = False
    # The flags' prefix: "" for ``watchcache sim``, "sim-" for ``serve --simulated`` (its messages name them).
    flag_prefix: str = ""

    @classmethod
    def from_args(cls, args: argparse.Namespace, prefix: str = "") -> SimOptions:
        """From ``watchcache sim``'s flags, or ``serve``'s ``--sim-*`` ones (``prefix`` ``sim_``)."""
        g = vars(args)
        return cls(
            objects=g[f"{prefix}objects"],
            namespaces=g[f"{prefix}namespaces"],
            nodes=g[f"{prefix}nodes"],
            churn=g[f"{prefix}churn"],
            seed=g[f"{prefix}seed"],
            state_file=g[f"{prefix}state_file"],
            policy_file=g[f"{prefix}policy_file"],
            anonymous=g.get("anonymous_auth", True) if args.command == "sim" else True,
            requestheader_ca_file=g.get("requestheader_client_ca_file"),
            flag_prefix=prefix.replace("_", "-"),
            crds=bool(g.get("crds")) if args.command == "sim" else False,
            flowcontrol=bool(g.get("flowcontrol")) if args.command == "sim" else False,
            requestheader_allowed_names=tuple(
                n.strip() for n in g.get("requestheader_allowed_names", "").split(",") if n.strip()
            ),
        )

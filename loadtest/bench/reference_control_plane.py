"""A real kube-controller-manager and kube-scheduler, pointed at the apiserver and then at watchcache.

Needs the reference kit running (``shared/tools/kube-reference``: start.sh without
``--control-plane``, then ``eval "$(shared/tools/kube-reference/env.sh)"``). Each round starts
the kit's controller manager and scheduler against the apiserver, runs the scenario of
``harness/kube/scenario.py``, stops them, and does the same through ``watchcache serve`` (TLS,
delegated authentication, default workers) in front of the apiserver. Prints the table of
docs/deploy.md: time per step (ranges over rounds) and the components' log counts.

    .venv/bin/python -m loadtest.bench.reference_control_plane --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.kube.comparison import compare, table
from harness.kube.controlplane import other_controller_manager
from harness.kube.kit import KubeEnv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="direct+proxy rounds (default 3)")
    parser.add_argument("--workdir", type=Path, help="keep the components' logs here (default: a temporary dir)")
    parser.add_argument("--proxy-args", default="", help="more flags for watchcache serve, e.g. '--workers 1'")
    parser.add_argument(
        "--identity", choices=("token", "certificate"), default="token",
        help="the components' credential: the admin token, or a system:masters client certificate (default token)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        kube = KubeEnv.from_environ()
    except BaseException as e:  # pytest.skip outside pytest
        print(f"cannot run: {e}", file=sys.stderr)
        return 2
    reason = other_controller_manager(kube)
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="reference-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = compare(
            kube, workdir, rounds=args.rounds, suffix="-bench", proxy_args=tuple(args.proxy_args.split()),
            identity=args.identity,
        )  # fmt: skip
    print(table(result))
    slow = result.slow_steps()
    if slow:
        print("\nover the allowance:\n  " + "\n  ".join(slow))
    if result.kubelet_errors:
        print("\nfake kubelet errors:\n  " + "\n  ".join(result.kubelet_errors[:20]))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())

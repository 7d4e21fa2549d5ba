"""Issue 34 item 2: every flag is checked when the command line is parsed, by its own name, in one line, exit 2.

The table is built from the parser itself, so a flag added later without a range fails
``test_every_value_flag_has_a_range_or_is_text``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from watchcache.argtypes import Count, Number, listen_address
from watchcache.flags import build_parser

# Flags whose value is text: a file, a name, a list, a URL, checked where they are used (at start).
TEXT_FLAGS = {
    "--tls-cert-file", "--tls-private-key-file", "--client-ca-file", "--continue-token-key-file", "--policy-file",
    "--state-file", "--sim-policy-file", "--sim-state-file", "--requestheader-client-ca-file",
    "--requestheader-allowed-names", "--kubeconfig", "--context", "--upstream", "--token-file",
    "--client-certificate", "--client-key", "--certificate-authority", "--resources", "--cache-exclude", "--shard-dir",
    "--authorization-always-allow-groups", "--proxy-client-cert-file", "--proxy-client-key-file",
    "--requestheader-username-headers", "--requestheader-group-headers", "--requestheader-extra-headers-prefix",
}  # fmt: skip


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def value_flags() -> Iterator[tuple[str, argparse.Action]]:
    for command, parser in commands().items():
        for action in parser._actions:
            if action.option_strings and action.nargs != 0 and action.dest != "help":
                yield command, action


def bad_values(kind: object) -> list[str]:
    """Values just outside the flag's range, and not a number at all."""
    if isinstance(kind, Count):
        out = [str(kind.minimum - 1), "1.5", "ten"]
        return out + ([str(kind.maximum + 1)] if kind.maximum is not None else [])
    if isinstance(kind, Number):
        return ["0" if kind.positive else "-1", "-0.5", "nan", "inf", "soon"]
    if kind is listen_address:
        return ["127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1", "localhost:http"]
    raise AssertionError(f"no bad values for {kind!r}")


CASES = [
    pytest.param(command, action.option_strings[0], value, id=f"{command} {action.option_strings[0]}={value}")
    for command, action in value_flags()
    if action.choices is None and action.option_strings[0] not in TEXT_FLAGS
    for value in bad_values(action.type)
]  # fmt: skip


def test_every_value_flag_has_a_range_or_is_text() -> None:
    unchecked = [
        f"{command} {action.option_strings[0]}"
        for command, action in value_flags()
        if action.choices is None
        and not isinstance(action.type, Count | Number)
        and action.type is not listen_address
        and action.option_strings[0] not in TEXT_FLAGS
    ]
    assert unchecked == []


def test_the_table_covers_every_command() -> None:
    assert {c.values[0] for c in CASES} == {"sim", "serve", "demo"}
    assert len(CASES) > 150


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_a_value_out_of_range_is_refused_by_the_flags_name(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"watchcache {command}: error: argument {flag}: "), err


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("serve", "--history-max-events", "1"),
        ("serve", "--fresh-wait", "0"),
        ("serve", "--max-limit", "0"),
        ("serve", "--max-connections", "0"),
        ("serve", "--request-timeout", "0"),
        ("serve", "--listen", "[::1]:0"),
        ("serve", "--listen", ":65535"),
        ("serve", "--bookmark-interval", "0.5"),
        ("sim", "--objects", "0"),
        ("sim", "--nodes", "0"),
        ("sim", "--churn", "0"),
        ("demo", "--namespaces", "1"),
    ],
)
def test_the_edges_of_each_range_are_accepted(command: str, flag: str, value: str) -> None:
    args = build_parser().parse_args([command, flag, value])
    assert getattr(args, flag[2:].replace("-", "_")) is not None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--listen", "127.0.0.1:99999", "--workers", "2", "--upstream", "http://127.0.0.1:1"],
         "watchcache serve: error: argument --listen: port must be 0-65535, got 99999"),
        (["serve", "--simulated", "--listen", "127.0.0.1:99999"],
         "watchcache serve: error: argument --listen: port must be 0-65535, got 99999"),
        (["serve", "--history-max-events", "-5", "--workers", "2", "--upstream", "http://127.0.0.1:1"],
         "watchcache serve: error: argument --history-max-events: must be at least 1, got -5"),
        (["serve", "--fresh-wait", "-1", "--simulated"],
         "watchcache serve: error: argument --fresh-wait: must be at least 0"),
        (["serve", "--max-limit", "-3", "--simulated"],
         "watchcache serve: error: argument --max-limit: must be at least 0"),
        (["sim", "--objects", "-5", "--churn", "-3", "--namespaces", "0"],
         "watchcache sim: error: argument --objects: must be at least 0, got -5"),
        (["sim", "--churn", "-3"], "watchcache sim: error: argument --churn: must be at least 0, got -3"),
        (["sim", "--namespaces", "0"], "watchcache sim: error: argument --namespaces: must be at least 1, got 0"),
        (["demo", "--sim-listen", "127.0.0.1:70000"], "watchcache demo: error: argument --sim-listen: port must be"),
        (["serve", "--upstream", "http://127.0.0.1:1", "--resources", "pods,a/b/c/d"],
         "watchcache serve: error: argument --resources: cannot parse resource 'a/b/c/d'"),
        (["serve", "--simulated", "--listen", "127.0.0.1:0", "--resources", "pods,bogus"],
         "watchcache: --resources: the simulated cluster does not serve bogus (it serves "),
        (["serve", "--upstream", "https://127.0.0.1:1", "--workers", "2", "--certificate-authority", "/absent/ca.crt"],
         "watchcache: the upstream's certificate-authority /absent/ca.crt: No such file or directory"),
        (["serve", "--upstream", "https://127.0.0.1:1", "--workers", "2", "--proxy-client-cert-file", "/absent/p.crt",
          "--proxy-client-key-file", "/absent/p.key"],
         "watchcache: --proxy-client-cert-file /absent/p.crt, --proxy-client-key-file /absent/p.key: No such file"),
    ],
    ids=["listen-2-workers", "listen-simulated", "history-max-events-2-workers", "fresh-wait", "max-limit",
         "sim-objects", "sim-churn", "sim-namespaces", "demo-sim-listen", "resources-unparsable",
         "resources-simulated-unknown", "upstream-ca-2-workers", "front-proxy-cert-2-workers"],
)  # fmt: skip
def test_the_issues_cases_exit_2_with_one_line_before_anything_starts(argv: list[str], message: str) -> None:
    """The cases of issue 34, as a user runs them: no traceback, nothing started, said once."""
    out = subprocess.run([sys.executable, "-m", "watchcache", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[-1].startswith(message), out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count(message) == 1 and out.stdout == "", out.stderr
    if ": error: argument " in message:  # refused by the parser: nothing else was said
        assert out.stderr.count("\n") == 1, out.stderr

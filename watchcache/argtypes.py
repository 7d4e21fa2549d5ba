"""Flag value types: each flag's range is checked while the command line is parsed.

argparse calls a flag's ``type`` on its text and, on ``ArgumentTypeError``, prints
``watchcache serve: error: argument --fresh-wait: must be at least 0, got -1`` and exits 2:
the flag's own name, before anything starts, once (a worker group's workers never see a value
the supervisor would not have accepted). The option objects keep their own checks for callers
that build them directly; these say the same thing in the flag's words.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Count", "Number", "listen_address", "parse_listen"]

MAX_PORT = 65535


def _number(text: str, parse: Callable[[str], float]) -> float:
    try:
        value = parse(text)
    except ValueError:
        kind = "an integer" if parse is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


@dataclass(frozen=True)
class Count:
    """An integer flag of at least ``minimum`` (and at most ``maximum``): a count, a size in bytes, a limit."""

    minimum: int
    maximum: int | None = None

    def __call__(self, text: str) -> int:
        value = int(_number(text, int))
        if value < self.minimum:
            raise argparse.ArgumentTypeError(f"must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise argparse.ArgumentTypeError(f"must be at most {self.maximum}, got {value}")
        return value


@dataclass(frozen=True)
class Number:
    """A duration or a rate: a finite number, above 0 if ``positive``, else at least 0."""

    positive: bool = False

    def __call__(self, text: str) -> float:
        value = _number(text, float)
        if self.positive and value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
        return value


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; an empty host is 127.0.0.1), the port 0-65535 (0: any free one)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"wants HOST:PORT, got {text!r}")
    if int(port) > MAX_PORT:
        raise ValueError(f"port must be 0-{MAX_PORT}, got {int(port)}")
    return host.strip("[]") or "127.0.0.1", int(port)


def listen_address(text: str) -> str:
    """A ``--listen`` value, checked (the text itself is kept: workers are handed it as given)."""
    try:
        parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text

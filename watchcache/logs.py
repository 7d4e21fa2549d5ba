"""Logging setup: text for people, JSON lines for log pipelines; the worker id on every line.

Components log with ``%s`` arguments (formatted only if the line is emitted) and never log
credentials: tokens are hashed before they are used as keys, and headers are not logged.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "worker"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        worker = getattr(record, "worker", None)
        if worker is not None:
            entry["worker"] = worker
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class _WorkerFilter(logging.Filter):
    def __init__(self, worker: int | None) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


def configure(level: str = "info", fmt: str = "text", worker: int | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_WorkerFilter(worker))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        who = f" w{worker}" if worker is not None else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s{who} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

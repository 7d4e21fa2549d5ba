"""The ``serve`` fixture: the HTTP server on a uvloop thread (tests/support/serverthread.py)."""

from tests.support.serverthread import serve

__all__ = ["serve"]

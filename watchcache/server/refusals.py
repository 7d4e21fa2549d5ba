"""How ``server/`` answers a cached read the cache does not: a Status, or the upstream (``PassThrough``).

The read's owner (``dispatch/reads.py``) returns neutral refusals (``dispatch/outcomes.py``); this
is where they become HTTP. A watch's refusal after it was accepted is written as an ERROR event
instead (``server/watch.py``), with the same Status.
"""

from __future__ import annotations

from typing import NoReturn

from watchcache.dispatch.outcomes import Delegated, Delegation, Expired, NotReady, Refusal, RetryLater, TooLarge
from watchcache.server.negotiation import PassReason


class PassThrough(Exception):
    """Raised by a cached read that must be answered by the upstream instead."""

    def __init__(self, reason: PassReason) -> None:
        super().__init__(reason)
        self.reason = reason


_PASS_REASONS = {
    Delegation.CONSISTENT_READ: PassReason.CONSISTENT_READ,
    Delegation.OLD_EXACT_READ: PassReason.OLD_EXACT_READ,
    Delegation.UNREACHED_RV: PassReason.UNREACHED_RV,
}


def refuse(refusal: Refusal) -> NoReturn:
    """Raise what answers ``refusal``: ``PassThrough`` by its reason, else its Status (``StatusError``)."""
    if isinstance(refusal, Delegated):
        raise PassThrough(_PASS_REASONS[refusal.reason])
    assert isinstance(refusal, (NotReady, TooLarge, Expired, RetryLater)), refusal
    raise refusal.status()

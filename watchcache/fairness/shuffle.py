"""Shuffle sharding: a flow's hand of queues, dealt from its hash (kube's ``shufflesharding``).

Each flow is dealt ``hand_size`` distinct queues of a level's ``queues``, from its hash, and waits
in the shortest of them; two flows rarely share a whole hand, so a flood from one flow fills its
own hand's queues and leaves almost every other flow a queue of its own. The hash is BLAKE2b (64 bits) of
the schema's name and the distinguisher, each length-prefixed: kube hashes the same two strings
with FNV-1a; its bytes need not match, and BLAKE2b is in C here.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = ["deal", "flow_hash"]


# Both are pure and asked for every request: memoized (a few flows, users or namespaces, are most
# of the traffic; the caches are bounded).
@functools.lru_cache(maxsize=4096)
def flow_hash(flow_schema: str, distinguisher: str) -> int:
    """A 64-bit hash of the flow (schema name, distinguisher)."""
    data = b"%d:%s%d:%s" % (len(flow_schema), flow_schema.encode(), len(distinguisher), distinguisher.encode())
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=4096)
def deal(hash_value: int, deck: int, hand: int) -> tuple[int, ...]:
    """``hand`` distinct cards of ``0..deck-1`` from ``hash_value``: kube's dealer (mixed-radix digits
    of the hash, each the index of a card among those not yet dealt)."""
    if not 1 <= hand <= deck:
        raise ValueError(f"hand {hand} must be in [1, deck {deck}]")
    dealt: list[int] = []
    for i in range(hand):
        hash_value, index = divmod(hash_value, deck - i)
        # The index-th card not yet dealt: walk the dealt cards in increasing order.
        card = index
        for taken in sorted(dealt):
            if taken <= card:
                card += 1
        dealt.append(card)
    return tuple(dealt)

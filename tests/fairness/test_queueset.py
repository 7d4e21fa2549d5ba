"""The queue set against simple models: shuffle sharding deals hands, dispatch is fair and work-conserving."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from watchcache.fairness.queueset import EXECUTING, REJECTED, WAITING, QueueSet
from watchcache.fairness.shuffle import deal, flow_hash


@settings(deadline=None)
@given(st.integers(0, (1 << 64) - 1), st.integers(1, 128), st.data())
def test_deal_gives_distinct_cards_in_the_deck(h: int, deck: int, data: st.DataObject) -> None:
    hand = data.draw(st.integers(1, min(deck, 8)))
    cards = deal(h, deck, hand)
    assert len(cards) == hand == len(set(cards))
    assert all(0 <= c < deck for c in cards)
    assert cards == deal(h, deck, hand)


def test_deal_spreads_flows_over_the_deck() -> None:
    # Every queue is in somebody's hand and two flows rarely share a whole hand (shuffle sharding).
    hands = [frozenset(deal(flow_hash("service-accounts", f"user-{i}"), 128, 6)) for i in range(2000)]
    assert set().union(*hands) == set(range(128))
    assert len(set(hands)) == len(hands)


# Operations: offer a request of flow f, finish the oldest executing one, or cancel a waiting one.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 9)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 16), st.data(), ops)
def test_invariants(limit: int, queues: int, data: st.DataObject, program: list[tuple[str, int]]) -> None:
    hand = data.draw(st.integers(1, queues))
    length = data.draw(st.integers(1, 5))
    qs = QueueSet(limit, queues, hand, length)
    executing, waiting = [], []
    for op, arg in program:
        if op == "offer":
            e = qs.offer(flow_hash("fs", str(arg)), arg)
            if e.state == REJECTED:
                assert e.reason == "queue-full"
                # Rejected only when the shortest queue of its hand is full.
                hand_of = deal(flow_hash("fs", str(arg)), queues, hand)
                shortest = min(hand_of, key=lambda q: len(qs.queues[q]) + qs.queue_executing[q])
                assert len(qs.queues[shortest]) >= length
            else:
                (executing if e.state == EXECUTING else waiting).append(e)
        elif op == "finish" and executing:
            e = executing.pop(arg % len(executing))
            dispatched = qs.finish(e)
            for d in dispatched:
                waiting.remove(d)
                executing.append(d)
        elif op == "cancel" and waiting:
            e = waiting.pop(arg % len(waiting))
            assert qs.cancel(e, "time-out")
        # Newly offered requests may have been dispatched by offer() itself.
        for e in [e for e in waiting if e.state == EXECUTING]:
            waiting.remove(e)
            executing.append(e)
        assert all(e.state == WAITING for e in waiting)
        assert qs.executing == len(executing) <= limit
        assert qs.waiting == len(waiting) == sum(len(q) for q in qs.queues)
        assert all(len(q) <= length for q in qs.queues)
        # Work-conserving: nobody waits while a seat is free.
        assert not waiting or qs.executing == limit


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2, 64), st.integers(1, 12), st.integers(0, 25))
def test_quiet_flow_waits_at_most_one_round(limit: int, queues: int, noisy_flows: int, turns: int) -> None:
    """Noisy flows keep their queues full; a quiet flow's request with ``k`` requests ahead of it in
    its queue is dispatched within ``k + 1`` rounds: one dispatch per non-empty queue each. With a
    queue of its own in its hand (the usual case with shuffle sharding) that is one round."""
    hand = min(queues, 6)
    qs = QueueSet(limit, queues, hand, 1000)
    executing = [qs.offer(flow_hash("fs", "warm"), None) for _ in range(limit)]
    for i in range(noisy_flows * 30):
        qs.offer(flow_hash("fs", f"noisy-{i % noisy_flows}"), None)
    for _ in range(turns):  # the round-robin pointer anywhere
        executing.extend(qs.finish(executing.pop(0)))
    quiet = qs.offer(flow_hash("fs", "quiet"), None)
    assert quiet.state == WAITING
    ahead = len(qs.queues[quiet.queue]) - 1
    rounds = ahead + 1
    nonempty = sum(1 for q in qs.queues if q)
    dispatches = 0
    while quiet.state == WAITING:
        new = qs.finish(executing.pop(0))
        executing.extend(new)
        dispatches += len(new)
        assert dispatches <= rounds * nonempty


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2, 32), st.lists(st.integers(0, 50), min_size=2, max_size=10, unique=True))
def test_backlogged_queues_are_served_alike(limit: int, queues: int, flows: list[int]) -> None:
    """Max-min fairness (the model): while queues stay backlogged, the numbers of requests dispatched
    from any two of them differ by at most one, however many requests each holds."""
    qs = QueueSet(limit, queues, 1, 10_000)
    executing = [qs.offer(flow_hash("fs", "warm"), None) for _ in range(limit)]
    for n, f in enumerate(flows):
        for _ in range(20 + 30 * n):  # unequal floods
            qs.offer(flow_hash("fs", str(f)), None)
    backlogged = [i for i, q in enumerate(qs.queues) if q]
    served = dict.fromkeys(backlogged, 0)
    while all(qs.queues[i] for i in backlogged):
        new = qs.finish(executing.pop(0))
        executing.extend(new)
        for e in new:
            served[e.queue] += 1
        assert max(served.values()) - min(served.values()) <= 1


def test_a_newly_active_queue_goes_at_the_next_free_seat() -> None:
    """A flow with one request at a time (below its fair share) does not wait for a round of floods."""
    qs = QueueSet(2, 64, 1, 1000)
    executing = [qs.offer(flow_hash("fs", "warm"), None) for _ in range(2)]
    noisy = [f"noisy-{i}" for i in range(8)]
    for i in range(400):
        qs.offer(flow_hash("fs", noisy[i % 8]), None)
    for _ in range(20):  # every noisy queue served once: a steady backlog
        executing.extend(qs.finish(executing.pop(0)))
    quiet = qs.offer(flow_hash("fs", "quiet"), None)
    assert qs.finish(executing.pop(0)) == [quiet]


def test_reject_level_has_no_queues() -> None:
    qs = QueueSet(2)
    a, b, c = (qs.offer(0, None) for _ in range(3))
    assert (a.state, b.state, c.state, c.reason) == (EXECUTING, EXECUTING, REJECTED, "concurrency-limit")
    assert qs.finish(a) == []
    assert qs.offer(0, None).state == EXECUTING

from collections import Counter

from watchcache.shard.ownership import owner_of, shard_map

IDS = [f"group{i % 7}/v1/resource{i}" for i in range(1000)]


def test_every_process_computes_the_same_owner():
    assert shard_map(IDS, 3) == shard_map(list(IDS), 3)
    assert all(0 <= owner_of(r, 3) < 3 for r in IDS)


def test_resources_spread_over_workers():
    counts = Counter(shard_map(IDS, 4).values())
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 180  # ~250 each


def test_adding_a_worker_moves_only_what_the_new_worker_takes():
    before, after = shard_map(IDS, 3), shard_map(IDS, 4)
    moved = [r for r in IDS if before[r] != after[r]]
    assert all(after[r] == 3 for r in moved)
    assert 150 < len(moved) < 350  # ~1/4


def test_removing_a_worker_moves_only_its_resources():
    before, after = shard_map(IDS, 4), shard_map(IDS, 3)
    moved = [r for r in IDS if before[r] != after[r]]
    assert all(before[r] == 3 for r in moved)

"""Merging the shards' counters: numpy's sums and order are the loop's exactly."""

from __future__ import annotations

import random

import pytest

from emulator.engine.result import _merge_counts


def _loop(dicts: list[dict]) -> dict:
    """The plain definition: int keys, summed in order, sorted by key."""
    total: dict[int, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[int(k)] = total.get(int(k), 0) + v
    return dict(sorted(total.items()))


def _counter(rng: random.Random) -> dict:
    keys = [rng.choice([rng.randrange(50), rng.randrange(-5, 5), rng.randrange(2**62), rng.randrange(2**64)])
            for _ in range(rng.randrange(0, 40))]  # fmt: skip
    if rng.random() < 0.3:
        keys.sort()  # a shard's buckets mostly come in time order
    counts = [rng.choice([1, rng.randrange(2**40), 2**62, -3, 2**63 - 1, 2**70]) for _ in keys]
    out = dict(zip(keys, counts, strict=True))
    if rng.random() < 0.1:
        out = {str(k): v for k, v in out.items()}  # an export read back from JSON
    return out


@pytest.mark.parametrize("seed", range(4))
def test_merged_counts_equal_the_loop_on_fuzzed_counters(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        dicts = [_counter(rng) for _ in range(rng.randrange(1, 4))]
        got, want = _merge_counts(dicts, nested=False), _loop(dicts)
        assert list(got.items()) == list(want.items())
        assert all(type(x) is int for item in got.items() for x in item)


def test_nested_counts_merge_per_key_in_key_order():
    a = {"send": {3: 1, 1: 2}, "all_reduce": {5: 1}}
    b = {"send": {1: 4}, "broadcast": {2: 2}}
    got = _merge_counts([a, b])
    assert list(got) == ["all_reduce", "broadcast", "send"]
    assert list(got["send"].items()) == [(1, 6), (3, 1)]

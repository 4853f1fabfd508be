"""The dedicated rules of a shard that runs the compiled per-op engine (dedicated.py's ``*_compiled``:
a tape's sends, receives and block proxies launched with their kinds' rules only, completions and
event keys on CompiledGPU's rows directly) against the generic ones (``Shard.dedicated = False``):
the same results bit for bit, tapes and suspensions included, on one shard and on several."""

from __future__ import annotations

import pytest

from emulator.engine import shard as engine_shard
from tests.emulator.engine.test_tape import _run


def _both(base: str, args: list[str], monkeypatch, shards: int = 1):
    monkeypatch.setattr(engine_shard.Shard, "dedicated", True)
    fast = _run(base, args, True, monkeypatch, shards)
    monkeypatch.setattr(engine_shard.Shard, "dedicated", False)
    generic = _run(base, args, True, monkeypatch, shards)
    return fast, generic


def test_the_dedicated_rules_are_taken(monkeypatch):
    """A compiled shard binds the dedicated variants; the generic shard keeps the class's."""
    taken = {}
    init = engine_shard.Shard.__init__

    def noting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        taken[self.dedicated] = (self.ops_core is not None, self.__dict__.get("_complete"))

    monkeypatch.setattr(engine_shard.Shard, "__init__", noting)
    _both("megatron-175b-64gpu", ["training.global_batch_size=16"], monkeypatch)
    assert taken[True][0] and taken[True][1] is not None
    assert taken[True][1].__func__ is engine_shard.Shard._complete_compiled
    assert taken[False][0] and taken[False][1] is None


@pytest.mark.parametrize(
    "args",
    [
        # suspensions in every phase of a step (few ops ahead), interleaved
        ["training.global_batch_size=16", "parallel.virtual_stages=2", "engine.max_ops_ahead=3"],
        ["training.global_batch_size=16", "parallel.virtual_stages=1", "parallel.schedule=gpipe",
         "engine.max_ops_ahead=5"],
    ],
)
def test_dedicated_rules_match_the_generic_ones(args, taped, monkeypatch):
    fast, generic = _both("megatron-175b-64gpu", args, monkeypatch)
    assert taped[0] > 0
    assert isinstance(fast[0], str) and len(fast[0]) == 32, fast[0]
    assert fast == generic


@pytest.mark.slow
@pytest.mark.parametrize(
    "base, args, shards",
    [
        ("megatron-1t-3072gpu", ["training.global_batch_size=24"], 2),
        ("megatron-1t-3072gpu", ["training.global_batch_size=24"], 3),
        ("megatron-175b-64gpu", ["training.global_batch_size=16", "faults.slow_gpu=[{ranks: [5], factor: 0.9}]",
                                 "engine.fold_tensor_groups=false"], 1),  # fmt: skip
        ("gpt3-175b-1024gpu", ["training.global_batch_size=128", "parallel.virtual_stages=2",
                               "engine.max_ops_ahead=2"], 1),  # fmt: skip
    ],
)
def test_dedicated_rules_on_more_shapes(base, args, shards, taped, monkeypatch):
    fast, generic = _both(base, args, monkeypatch, shards)
    assert taped[0] > 0
    assert fast == generic

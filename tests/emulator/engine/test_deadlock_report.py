"""The compiled op engine's deadlock report equals the Python op engine's (issue 24): a rank's
blocks that the kernels hold are named by the ops the Python rules would hold at its streams'
heads - on ``compute`` the block's op there (a compute op with its microbatch suffix, an alloc or a
free named after its allocation), on ``tp`` the collective there, numbered as launched, and when it
started, the group members it waits for (a collective mismatch where a member is elsewhere) - in
every EMULATOR_TAPE mode, on one shard and several (diagnose._heads; before, the compiled engine
named a block's proxy ``None``, left out its collective and reported a deadlock where the Python
rules report the collective mismatch)."""

from __future__ import annotations

import pytest

from emulator.config.loader import load_run
from emulator.engine import api as engine_api
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from tests.emulator.engine.test_tape_review import MODES, RUN

G16 = ["training.global_batch_size=16"]
UNFOLDED = "engine.fold_tensor_groups=false"  # members arrive one by one (a block waits in a collective)


def _wrong_tag(monkeypatch, rank: int, backward: bool, nth: int = 1) -> list[int]:
    """Rank ``rank``'s ``nth`` forward (or backward) pipeline receive takes a tag nobody sends."""
    seen = [0]
    prepare = engine_api.GPU.prepare_p2p

    def changed(self, kind, peer, size_bytes, tag=0):
        if kind == "recv" and self.rank == rank and (tag >= 1000) == backward:
            seen[0] += 1
            if seen[0] == nth:
                tag += 7
        return prepare(self, kind, peer, size_bytes, tag)

    monkeypatch.setattr(engine_api.GPU, "prepare_p2p", changed)
    return seen


def _error(overrides: list[str], mode: str, shards: int, monkeypatch, seen: list[int]) -> tuple:
    monkeypatch.setenv("EMULATOR_TAPE", mode)
    seen[0] = 0
    with pytest.raises(EmulatorError) as info:
        execute(load_run(RUN, overrides), shards=shards)
    return type(info.value).__name__, str(info.value), info.value.exit_code


@pytest.mark.parametrize(
    "rank, backward, nth, overrides, shards, error",
    [
        (24, False, 1, [*G16, "parallel.virtual_stages=1"], 1, "DeadlockError"),  # blocks with their alloc first
        (8, False, 1, [*G16, "parallel.virtual_stages=2"], 1, "DeadlockError"),
        (16, True, 1, [*G16, "parallel.virtual_stages=1"], 1, "DeadlockError"),  # a backward block: compute first
        (16, True, 1, [*G16, "parallel.virtual_stages=1", "training.recompute=full"], 1, "DeadlockError"),
        # blocks launched half way (max_ops_ahead: the kernels hold their first rows only), 2 shards
        (56, False, 1, [*G16, "parallel.virtual_stages=2", "engine.max_ops_ahead=3"], 1, "DeadlockError"),
        (8, False, 1, [*G16, "parallel.virtual_stages=1", "engine.max_ops_ahead=2", "training.recompute=full"], 2,
         "DeadlockError"),
        # unfolded: a member's block waits in its started collective for the member the deadlock holds
        (8, True, 1, [*G16, "parallel.virtual_stages=1", UNFOLDED], 2, "CollectiveMismatchError"),
        (24, True, 2, [*G16, "parallel.virtual_stages=2", "engine.max_ops_ahead=2", UNFOLDED,
                       "training.recompute=full"], 1, "CollectiveMismatchError"),
    ],
)  # fmt: skip
def test_deadlock_report_names_blocks_as_the_python_op_engine(rank, backward, nth, overrides, shards, error,
                                                              monkeypatch):  # fmt: skip
    seen = _wrong_tag(monkeypatch, rank, backward, nth)
    python = _error([*overrides, "engine.op_engine=python"], "0", shards, monkeypatch, seen)
    assert python[0] == error and python[2] == 2, python
    for mode in MODES:
        assert _error(overrides, mode, shards, monkeypatch, seen) == python, mode

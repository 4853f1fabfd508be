"""The compiled op engine's deadlock report equals the Python op engine's (issue 24): a block that
waits is named by its first op on ``compute`` (a compute op with its microbatch suffix, or the
block's alloc) and its first tensor collective on ``tp``, in every EMULATOR_TAPE mode
(diagnose._heads; before, the compiled engine named the block's proxy ``None`` and left out the
collective)."""

from __future__ import annotations

import pytest

from emulator.engine import api as engine_api
from tests.emulator.engine.test_tape_review import MODES, _run

G16 = ["training.global_batch_size=16"]


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


@pytest.mark.parametrize(
    "rank, backward, overrides",
    [
        (24, False, [*G16, "parallel.virtual_stages=1"]),  # blocks waiting with their alloc first
        (8, False, [*G16, "parallel.virtual_stages=2"]),
        (16, True, [*G16, "parallel.virtual_stages=1"]),  # a backward block: its compute op first
        (16, True, [*G16, "parallel.virtual_stages=1", "training.recompute=full"]),  # its named alloc first
    ],
)
def test_deadlock_report_names_blocks_as_the_python_op_engine(rank, backward, overrides, monkeypatch):
    seen = _wrong_tag(monkeypatch, rank, backward)
    python = _run([*overrides, "engine.op_engine=python"], "0", monkeypatch, seen)
    assert python[0] == "DeadlockError" and "on stream tp waiting for another stream" in python[1], python
    for mode in MODES:
        assert _run(overrides, mode, monkeypatch, seen) == python, mode

"""Fixtures shared by the engine's tape tests (test_tape.py, test_tape_dedicated.py)."""

from __future__ import annotations

import pytest

from emulator.engine import shard as engine_shard


@pytest.fixture
def taped(monkeypatch):
    """How many steps ran from tapes."""
    steps = [0]
    run_tape = engine_shard.Shard.run_tape

    def counting(self, gpu, tape, held):
        steps[0] += len(tape)
        return run_tape(self, gpu, tape, held)

    monkeypatch.setattr(engine_shard.Shard, "run_tape", counting)
    return steps

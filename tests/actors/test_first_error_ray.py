"""Errors two shards meet in the same round, on Ray with 2 shards (both round protocols): the run
reports the one a single shard meets, the first in event order (coordinator.first_error), not the
lowest shard's (tests/emulator/engine/test_opcore_fuzz2.py runs the same case on in-process shards)."""

from __future__ import annotations

import pytest

from tests.emulator.engine.test_opcore_fuzz import run_dir
from tests.emulator.engine.test_opcore_fuzz2 import BASE, FAILING

# two replicas out of memory at the same point of their programs, replica 0 (shard 0) later
SLOW_SHARD_0 = [*FAILING, "faults.slow_gpu=[{ranks: [0, 1, 2, 3, 4, 5, 6, 7], factor: 0.9}]"]


@pytest.mark.parametrize("rounds", ["direct", "calls"])
def test_the_first_error_in_event_order_is_reported_on_ray(ray_cluster, tmp_path, rounds):
    overrides = [*SLOW_SHARD_0, f"engine.ray_rounds={rounds}"]
    one, _ = run_dir(BASE, SLOW_SHARD_0, "compiled", tmp_path / "inline", 1, "none")
    on_ray, _ = run_dir(BASE, overrides, "compiled", tmp_path / "ray", 2, "none", backend="ray")
    assert one is not None and one[0] == "OutOfMemoryError" and "on rank 8 at t=7.041603 s" in one[1]
    assert on_ray == one

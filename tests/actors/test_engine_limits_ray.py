"""The compiled engines at their limits on Ray with 2 shards (tests/emulator/engine/test_engine_limits.py
runs them on in-process shards): blocks longer than the ring of op slots at two ops ahead, and
pipeline messages through the compiled message core, against the Python rules, file for file."""

from __future__ import annotations

import pytest

from tests.emulator.engine.test_engine_limits import LONG, LONG_OVERRIDES, P2P
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs, run_dir


@pytest.mark.slow
def test_blocks_longer_than_the_ring_on_ray(ray_cluster, tmp_path):
    """(The actors' templates are out of reach here: test_engine_limits.py's in-process cases of the
    same config show its blocks longer than the ring.)"""
    assert_same_run_dirs(tmp_path, LONG, [*LONG_OVERRIDES, "engine.max_ops_ahead=2"], shards=2, trace="none",
                         backend="ray")  # fmt: skip


@pytest.mark.slow
def test_pipeline_messages_in_the_core_on_ray(ray_cluster, tmp_path):
    overrides = ["training.global_batch_size=16", "parallel.virtual_stages=1", "engine.max_ops_ahead=3",
                 "faults.slow_gpu=[{ranks: [60], factor: 0.5}]"]  # fmt: skip
    files = []
    for engine in ("compiled", "python"):
        error, out = run_dir(P2P, [*overrides, f"engine.collective_engine={engine}"], "compiled",
                             tmp_path / engine, 2, "none", backend="ray")  # fmt: skip
        assert error is None
        out = dict(out)
        out["config.yaml"] = [line for line in out["config.yaml"] if "collective_engine:" not in line]
        files.append(out)
    assert files[0] == files[1]

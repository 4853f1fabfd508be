"""The compiled per-op engine (emulator/engine/opcore.py) on Ray with 2 shards: every file of the
run directory equal to the Python rules' (tests/emulator/engine/test_opcore_fuzz.py compares them
on in-process shards), and the fingerprint equal to one in-process shard's."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs, run_dir


@pytest.mark.parametrize(
    ("name", "overrides", "trace"),
    [
        ("megatron-1t-3072gpu", ["training.global_batch_size=12"], "0-15"),
        # a straggler: tensor groups unfolded, each member's arrival in the kernels (untraced: rank
        # 5's group runs them too)
        ("megatron-1t-3072gpu", ["training.global_batch_size=12", "faults.slow_gpu=[{ranks: [5], factor: 0.9}]"],
         "none"),
        # programs suspended in the middle of a block, every rank traced, an interleaved schedule (17 s)
        pytest.param(
            "megatron-175b-64gpu",
            ["training.global_batch_size=16", "engine.max_ops_ahead=2"],
            "all",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_compiled_on_ray_matches_the_python_rules(ray_cluster, tmp_path, name, overrides, trace):
    path = CONFIGS / "runs" / f"{name}.yaml"
    assert_same_run_dirs(tmp_path, path, overrides, shards=2, trace=trace, backend="ray")
    _, inline = run_dir(path, overrides, "compiled", tmp_path / "inline", 1, trace)
    on_ray = json.loads((next(tmp_path.glob(f"{name}-*-c")) / "summary.json").read_text())
    assert on_ray["backend"] == "ray" and on_ray["fingerprint"] == inline["summary.json"]["fingerprint"]

"""Tapes (emulator/engine/tape.py) on Ray with 2 shards: the compiled engine's run, whose untraced
middle stages run their plain steps from tapes, writes the same run directory as the Python rules'
(no tapes: they need the compiled engine), and the fingerprint of one in-process shard.

EMULATOR_TAPE cannot switch tapes off here: the actors read their own environment (a cluster started
before the test does not see the driver's), so the comparison is against ``engine.op_engine=python``."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs, run_dir


@pytest.mark.slow
def test_tapes_on_ray_match_the_program(ray_cluster, tmp_path):
    # interleaved (3 chunks), programs 2 ops ahead: tapes suspended in every phase of a step; a NIC
    # on the pipeline's path slowed for a window; sends to the other shard through the lookahead
    overrides = ["training.global_batch_size=16", "engine.max_ops_ahead=2",
                 "faults.slow_link=[{nic: {node: 2, index: 0}, factor: 0.1, start_s: 0.05, end_s: 0.2}]"]  # fmt: skip
    path = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
    assert_same_run_dirs(tmp_path, path, overrides, shards=2, trace="none", backend="ray")
    _, inline = run_dir(path, overrides, "compiled", tmp_path / "inline", 1, "none")
    on_ray = json.loads((next(tmp_path.glob("megatron-175b-64gpu-*-c")) / "summary.json").read_text())
    assert on_ray["backend"] == "ray" and on_ray["fingerprint"] == inline["summary.json"]["fingerprint"]

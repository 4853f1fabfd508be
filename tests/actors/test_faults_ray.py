"""Faults on Ray: a straggler and jitter give the in-process results, bit for bit, on 2 shards."""

from __future__ import annotations

from emulator.config.loader import load_run
from emulator.run import execute
from tests.conftest import CONFIGS


def test_straggler_and_jitter_on_ray_equal_in_process(ray_cluster):
    overrides = ["training.iterations=1", "faults.jitter.sigma=0.05", "faults.seed=7"]
    config = load_run(CONFIGS / "runs/bloom-560m-straggler.yaml", overrides)
    inline, _, _ = execute(config, "inline", 1)
    on_ray, _, _ = execute(load_run(CONFIGS / "runs/bloom-560m-straggler.yaml", overrides), "ray", 2)
    assert on_ray["fingerprint"] == inline["fingerprint"]
    assert on_ray["stragglers"] == inline["stragglers"] and inline["stragglers"][0]["rank"] == 5

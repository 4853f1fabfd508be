"""Jobs sharing a cluster on Ray: two jobs on every node, 2 shards, the in-process results bit for bit."""

from __future__ import annotations

from emulator.config.loader import load_run
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS

PROGRAM = CONFIGS / "examples/programs.py"


def test_jobs_on_ray_equal_in_process(ray_cluster):
    """spread puts both jobs on all 4 nodes, so each job's all-reduce crosses the 2 shards."""
    overrides = ["placement=spread"] + [
        f"jobs.{i}={{name: {name}, gpus: 16, program: '{PROGRAM}:data_parallel_step', "
        "program_args: {iterations: 1, grad_bytes: 67108864}}"
        for i, name in enumerate("ab")
    ]
    inline, _, _ = execute(load_run(CONFIGS / "runs/two-jobs-shared-nics.yaml", overrides), "inline", 1)
    on_ray, _, _ = execute(load_run(CONFIGS / "runs/two-jobs-shared-nics.yaml", overrides), "ray", 2)
    assert on_ray["fingerprint"] == inline["fingerprint"] and on_ray["jobs"] == inline["jobs"]
    assert on_ray["cross_shard_messages"] > 0

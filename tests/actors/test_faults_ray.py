"""Faults on Ray: a straggler and jitter give the in-process results, bit for bit, on 2 shards."""

from __future__ import annotations

from emulator.config.loader import load_run
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS


def test_straggler_and_jitter_on_ray_equal_in_process(ray_cluster):
    overrides = ["training.iterations=1", "faults.jitter.sigma=0.05", "faults.seed=7"]
    config = load_run(CONFIGS / "runs/bloom-560m-straggler.yaml", overrides)
    inline, _, _ = execute(config, "inline", 1)
    on_ray, _, _ = execute(load_run(CONFIGS / "runs/bloom-560m-straggler.yaml", overrides), "ray", 2)
    assert on_ray["fingerprint"] == inline["fingerprint"]
    assert on_ray["stragglers"] == inline["stragglers"] and inline["stragglers"][0]["rank"] == 5


def test_node_failure_on_ray_reports_as_in_process(ray_cluster):
    """A node going down stops the Ray run with the in-process line and stop time."""
    import pytest

    from emulator.errors import FailureError

    errors = []
    for backend, shards in (("inline", 1), ("ray", 2)):
        with pytest.raises(FailureError) as err:
            execute(load_run(CONFIGS / "examples/node-failure.yaml"), backend, shards)
        errors.append((str(err.value), err.value.run_summary["virtual_time_reached_s"]))
    assert errors[0] == errors[1] and errors[0][0].startswith("node 1 failed at t=0.100000 s")

"""The Ray backend against the inline one: identical results, the same errors, lost shards.

PYTHONPATH=. python -m pytest -q tests/actors -m ray
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.config.loader import load_run
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.errors import BackendError, CollectiveMismatchError, DeadlockError, OutOfMemoryError
from emulator.runner.sequence import execute
from tests.actors.conftest import RAY_NODES
from tests.conftest import CONFIGS, ROOT, cluster_dict

pytestmark = pytest.mark.ray

# differ by design: wall-clock figures and where the shards ran
WALL_CLOCK = {"backend", "wall_time_s", "speed_ratio", "events_per_s", "shard_busy_s", "round_overhead_s",
              "shard_nodes"}  # fmt: skip
PROGRAMS = Path(__file__).with_name("programs.py")


def figures(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK}


def identity_cases() -> dict:
    """data-parallel.yaml on 4 nodes, point-to-point ping-pong, and pipeline chains plus
    data-parallel all-reduces that cross shard boundaries (tests/actors/programs.py)."""
    pipeline = {
        "name": "pipe",
        "cluster": cluster_dict(nodes=4, gpus=4),
        "program": f"{PROGRAMS}:pipeline_data_parallel",
    }
    return {
        "data-parallel": load_run(CONFIGS / "examples/data-parallel.yaml",
                                  ["cluster.nodes=4", "program_args.iterations=2", "program_args.grad_bytes=67108864"]),
        "ping-pong": load_run(CONFIGS / "examples/ping-pong.yaml", ["program_args.iterations=2"]),
        "pipeline": from_dict(RunConfig, pipeline, ""),
        # the built-in workload, folded (one virtual GPU per tensor group) with pipeline and data
        # parallelism across shards
        "workload": load_run(CONFIGS / "runs/megatron-22b-8gpu.yaml",
                             ["cluster.nodes=4", "parallel.pipeline=2", "parallel.data=2", "model.num_layers=4",
                              "training.global_batch_size=16"]),
        # context parallelism (ring K/V exchange across nodes) and FSDP hybrid sharding
        "context": load_run(CONFIGS / "runs/llama31-70b-cp-64gpu.yaml",
                            ["cluster.nodes=4", "parallel.tensor=8", "parallel.pipeline=2", "parallel.data=1",
                             "parallel.virtual_stages=1", "model.num_layers=4", "training.seq_length=4096",
                             "training.global_batch_size=4"]),
        "zero3-hybrid": load_run(CONFIGS / "runs/llama3-70b-zero3-64gpu.yaml",
                                 ["cluster.nodes=4", "parallel.data=32", "parallel.zero_shard_group=8",
                                  "model.num_layers=2", "training.seq_length=1024", "training.global_batch_size=32"]),
        # torchtitan's recipe: per-op checkpointing, eager kernels, ZeRO-3 with FSDP2's root unit
        "torchtitan": load_run(CONFIGS / "runs/llama3-8b-64gpu.yaml",
                               ["cluster.nodes=4", "parallel.tensor=1", "parallel.pipeline=1", "parallel.data=32",
                                "parallel.zero_stage=3", "model.num_layers=2", "training.seq_length=1024",
                                "training.global_batch_size=64", "training.recompute=op_selective",
                                "training.kernels=eager", "training.attention=flash"]),
        # mixture of experts: expert parallelism 8 (all-to-all across nodes), seeded imbalance
        "moe": load_run(CONFIGS / "runs/mixtral-8x7b-ep8-64gpu.yaml",
                        ["cluster.nodes=4", "parallel.pipeline=1", "parallel.data=32", "model.num_layers=2",
                         "training.global_batch_size=32", "training.seq_length=1024"]),
    }  # fmt: skip


class Recorder:
    """An observer that keeps what it is told."""

    def __init__(self):
        self.updates = []

    def update(self, rounds, virtual_time_ns, shard_stats):
        self.updates.append((rounds, [s["shard"] for s in shard_stats]))


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_identical_results_inline_and_on_ray(ray_cluster, shards):
    """Every figure of summary.json (wall clock aside) and the fingerprint match the inline run."""
    for name, config in identity_cases().items():
        reference, _, _ = execute(config, "inline", 1)
        inline, _, _ = execute(config, "inline", shards)
        recorder = Recorder()
        on_ray, result, _ = execute(config, "ray", shards, observer=recorder if shards > 1 else None)
        assert on_ray["backend"] == "ray" and on_ray["shards"] == shards
        assert figures(on_ray) == figures(inline), name
        assert on_ray["fingerprint"] == reference["fingerprint"], name
        nodes = on_ray["shard_nodes"]  # one {"node_id", "host", "niceness"} per shard, each on a node of its own
        assert len(nodes) == shards and all(set(n) == {"node_id", "host", "niceness"} for n in nodes), name
        assert all(n["niceness"] == 0 for n in nodes), name  # not Ray's 15: the shards are the job
        assert len({n["node_id"] for n in nodes}) == min(shards, RAY_NODES), name
        if shards > 1:  # live figures seen
            assert recorder.updates[-1] == (on_ray["rounds"], list(range(shards)))
        if name == "pipeline" and shards > 1:
            assert on_ray["cross_shard_messages"] > 0


def test_pipeline_stages_on_four_ray_nodes(ray_cluster):
    """The built-in workload with four pipeline stages on four shards: one shard per Ray node, and
    the fingerprint of the in-process run on one shard."""
    config = load_run(CONFIGS / "runs/megatron-22b-8gpu.yaml",
                      ["cluster.nodes=4", "parallel.pipeline=4", "model.num_layers=4", "training.global_batch_size=8"])
    reference, _, _ = execute(config, "inline", 1)
    on_ray, _, _ = execute(config, "ray", 4)
    assert len({n["node_id"] for n in on_ray["shard_nodes"]}) == 4 == RAY_NODES
    assert on_ray["cross_shard_messages"] > 0 and on_ray["fingerprint"] == reference["fingerprint"]
    assert figures(on_ray) == figures(execute(config, "inline", 4)[0])


def test_observed_single_shard_slices_time_like_inline(ray_cluster):
    """One observed shard advances in the inline backend's slices: same rounds, same figures."""
    import ray

    config = load_run(CONFIGS / "examples/data-parallel.yaml", ["program_args.grad_bytes=67108864"])
    inline, _, _ = execute(config, "inline", 1, observer=Recorder())
    on_ray, result, _ = execute(config, "ray", 1, observer=Recorder())
    assert figures(on_ray) == figures(inline) and on_ray["rounds"] > 1
    assert {s["node_id"] for s in result.extra["shard_nodes"]} <= {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.mark.parametrize(
    ("name", "error"),
    [("deadlock", DeadlockError), ("mismatch", CollectiveMismatchError), ("oom", OutOfMemoryError)],
)
def test_user_errors_are_the_inline_ones(ray_cluster, name, error):
    """Deadlock, collective mismatch and OOM raise the inline backend's exception and message."""
    config = load_run(CONFIGS / f"examples/{name}.yaml")
    with pytest.raises(error) as inline:
        execute(config, "inline", 2)
    with pytest.raises(error) as on_ray:
        execute(config, "ray", 2)
    assert str(on_ray.value) == str(inline.value)


def test_cli_runs_on_ray_and_writes_the_run_dir(ray_cluster, tmp_path):
    """``emulator run --backend ray --shards 2`` (reusing the session's Ray) writes both files."""
    from emulator.cli import main

    out = tmp_path / "run"
    assert main(["run", str(CONFIGS / "examples/ping-pong.yaml"), "--backend", "ray", "--shards", "2",
                 "--set", "program_args.iterations=1", "--out", str(out), "--quiet"]) == 0  # fmt: skip
    assert (out / "config.yaml").is_file() and '"backend": "ray"' in (out / "summary.json").read_text()


def test_unreachable_address_is_one_line(tmp_path):
    """A closed port: exit 2 and one 'cannot connect' line, in seconds, config.yaml kept."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "emulator", "run", "configs/examples/ping-pong.yaml", "--backend",
                           "ray", "--address", f"127.0.0.1:{port}", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [lines[0]] and re.match(rf"error: cannot connect to Ray at 127.0.0.1:{port}: ", lines[0])
    assert time.monotonic() - started < 20
    assert (out / "config.yaml").is_file()


class _NoRay:
    """A Ray module that was never initialised (connect() must fail before calling init)."""

    @staticmethod
    def is_initialized() -> bool:
        return False

    @staticmethod
    def init(**_):
        raise AssertionError("ray.init called for an address that does not answer")


def test_auto_pointing_at_a_stopped_cluster_is_one_line(monkeypatch):
    """`--address auto` where Ray's record names a cluster that has stopped (its temp directory
    outlives the cluster): one line in seconds, naming what auto resolved to, not minutes of retries."""
    import socket

    import ray._private.services as services

    from actors.backend import connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: f"127.0.0.1:{port}")
    with pytest.raises(BackendError, match=rf"^cannot connect to Ray at auto \(resolved to 127.0.0.1:{port}\): "):
        connect(_NoRay, "auto")

    def none_running(addr, temp_dir=None):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")

    monkeypatch.setattr(services, "canonicalize_bootstrap_address", none_running)
    with pytest.raises(BackendError, match=r"^cannot connect to Ray at auto: Could not find any running Ray instance"):
        connect(_NoRay, "auto")

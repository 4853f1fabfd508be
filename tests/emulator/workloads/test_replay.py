"""Replay of captured ranks (emulator/workloads/replay.py) on hand-written captures: no torch needed.

    python -m pytest -q tests/emulator/workloads/test_replay.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import emulator
from emulator.errors import CollectiveMismatchError, DeadlockError
from emulator.hardware.compute import op_duration_ns
from emulator.hardware.gpus import get_gpu
from emulator.workloads import replay

REPLAY = Path(replay.__file__).resolve()
MiB = 1 << 20


def _template(ops, groups, frames=("train.py:10", "train.py:20", "train.py:30")) -> dict:
    return {"ops": ops, "frames": list(frames), "groups": groups, "peak_bytes": 0, "iterations": 1,
            "captured_from": 0}  # fmt: skip


def _dp_template(world: int, grad_bytes: int = 64 * MiB) -> dict:
    """A data-parallel step: weights, forward and backward matmuls, an async gradient all-reduce
    waited for before the optimizer step, an iteration mark."""
    ops = [
        ["A", 1, 512 * MiB, 0],  # weights
        ["C", "mm", 4e12, 1e8, "matmul", "bf16", 0, 0],
        ["A", 2, 256 * MiB, 0],  # activations
        ["C", "mm", 8e12, 2e8, "matmul", "bf16", 1, 0],
        ["F", 2],
        ["K", "all_reduce", grad_bytes, 0, 0, 3, 1, 0],
        ["C", "add_", 0, 1e9, "elementwise", "fp32", 2, 0],
        ["W", 3, 2, 0],
        ["C", "addcdiv_", 0, 4e9, "elementwise", "fp32", 2, 0],
        ["I", 2],
    ]
    return _template(ops, [list(range(world))])


def _write(tmp_path: Path, captures: dict, nodes: int = 1, gpus: int = 8) -> Path:
    path = tmp_path / "captures.json"
    path.write_text(json.dumps(captures))
    run = tmp_path / "run.yaml"
    run.write_text(f"name: replayed\ncluster: dgx-h100-ndr\nprogram: {json.dumps(f'{REPLAY}:program')}\n"
                   f"program_args: {{capture: {json.dumps(str(path))}}}\n")  # fmt: skip
    return run


def _captures(world: int, template: dict) -> dict:
    return {"world_size": world, "templates": [template], "rank_template": [0] * world, "rank_groups": {},
            "uniform": True}  # fmt: skip


def test_compute_runs_fuse_and_keep_their_time():
    spec = get_gpu("h100-sxm-80gb")
    steps = replay.build_steps(_dp_template(8), spec)
    computes = [s for s in steps if s[0] == replay.COMPUTE]
    # the two matmuls are one kernel of their summed roofline times; the elementwise ops around the
    # all-reduce are two more (the collective splits the run)
    assert len(computes) == 3
    expected = op_duration_ns(spec, 4e12, 1e8, "matmul", "bf16") + op_duration_ns(spec, 8e12, 2e8, "matmul", "bf16")
    assert computes[0][2] == expected
    assert computes[0][4] == "train.py:10"  # named after the script line of its first op
    memory = [s for s in steps if s[0] == replay.MEMORY]
    # the first run reaches weights + activations and leaves the weights
    assert memory[0][1:4] == (0, 768 * MiB, 512 * MiB)


def test_replay_is_an_ordinary_run(tmp_path):
    world = 16
    run = _write(tmp_path, _captures(world, _dp_template(world)), nodes=2)
    r = emulator.run(run, overrides={"cluster.nodes": 2})
    s = r.summary
    assert s["world_size"] == world
    assert s["iteration_time_s"] > 0
    spec = get_gpu("h100-sxm-80gb")
    compute_ns = sum(step[2] for step in replay.build_steps(_dp_template(world), spec) if step[0] == replay.COMPUTE)
    # the iteration is the compute plus whatever of the all-reduce the last two kernels do not hide
    assert s["iteration_time_s"] * 1e9 >= compute_ns
    peak = max(row["peak_memory_bytes"] for row in r.tables.ranks)
    assert peak == 768 * MiB
    # the captured FLOPs reach the per-rank table (one iteration of 4 + 8 TFLOP)
    assert r.tables.ranks[0]["flops"] == 12e12


def test_same_results_on_any_shard_count(tmp_path):
    world = 16
    run = _write(tmp_path, _captures(world, _dp_template(world)))
    one = emulator.run(run, overrides={"cluster.nodes": 2})
    two = emulator.run(run, overrides={"cluster.nodes": 2}, shards=2)
    four = emulator.run(run, overrides={"cluster.nodes": 2}, shards=4)
    assert one.fingerprint == two.fingerprint == four.fingerprint


def test_a_mismatched_collective_names_the_script_line_and_ranks():
    world = 4
    good = _dp_template(world)
    bad = json.loads(json.dumps(good))
    bad["ops"][5] = ["K", "all_gather", 64 * MiB, 0, 0, 3, 2, 0]  # issued at train.py:30
    captures = {"world_size": world, "templates": [good, bad], "rank_template": [0, 0, 1, 0], "rank_groups": {}}
    with pytest.raises(CollectiveMismatchError) as err:
        replay.check_streams(captures)
    line = str(err.value)
    assert "\n" not in line
    assert "rank 2 issued all_gather" in line and "train.py:30" in line
    assert "rank(s) 0-1 issued all_reduce" in line and "train.py:20" in line


def test_mismatched_send_recv_order_is_a_deadlock_with_lines():
    # both ranks receive first, then send: each waits forever for the other's send
    def rank(peer):
        return _template([["P", "recv", peer, 1024, 0, 1, 0, 0], ["W", 1, 0, 0], ["P", "send", peer, 1024, 0, 2, 1, 0]],
                         [])  # fmt: skip

    captures = {"world_size": 2, "templates": [rank(1), rank(0)], "rank_template": [0, 1], "rank_groups": {}}
    with pytest.raises(DeadlockError) as err:
        replay.check_streams(captures)
    line = str(err.value)
    assert line.startswith("deadlock: rank(s) 0-1 blocked forever")
    assert "rank 0 waits at train.py:10 for a receive from rank 1" in line


def test_matched_point_to_point_passes_the_check():
    first = _template([["P", "send", 1, 1024, 0, 1, 0, 0], ["P", "recv", 1, 1024, 0, 2, 1, 0], ["W", 2, 1, 0]], [])
    second = _template([["P", "recv", 0, 1024, 0, 1, 0, 0], ["W", 1, 0, 0], ["P", "send", 0, 1024, 0, 2, 1, 0]], [])
    replay.check_streams({"world_size": 2, "templates": [first, second], "rank_template": [0, 1], "rank_groups": {}})


def test_a_collective_some_member_never_issues_is_a_deadlock():
    world = 2
    waits = _template([["K", "all_reduce", 1024, 0, 0, 1, 0, 0], ["W", 1, 0, 0]], [[0, 1]])
    idle = _template([], [[0, 1]])
    captures = {"world_size": world, "templates": [waits, idle], "rank_template": [0, 1], "rank_groups": {}}
    with pytest.raises(DeadlockError, match=r"rank 0 waits at train.py:10 for all_reduce #0 .* rank\(s\) 1 never"):
        replay.check_streams(captures)

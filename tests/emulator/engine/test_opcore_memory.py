"""Allocs and frees inside compiled blocks (opkernels.I_A / I_F) against the Python rules.

training.py joins a microbatch's activations' alloc to its forward layers, and the rebuilt layers'
allocs and frees (full or per-op recomputation) and the activations' free to its backward layers,
so the kernels apply Shard._instant / _complete to them: memory counters, the capacity check, the
live allocations an out-of-memory error lists, and the program resumed by an instant op half way
through the compute stream's loop (small ``max_ops_ahead``: OpCore.instant_stop's ST_IRESUME),
a block whose last op is a free (ST_IBLOCK). Whole run directories under both engines, byte for
byte (tests/emulator/engine/test_opcore_fuzz.py's comparison), on 1, 2 and 4 shards, with the
statuses each case must reach so that a case that never takes a path is seen.
"""

from __future__ import annotations

import pytest

from emulator.engine import opkernels as k
from emulator.engine.opcore import OpCore
from emulator.workloads.tensor_parallel import launch_prepared
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs

SLOW_5 = "faults.slow_gpu=[{ranks: [5], factor: 0.9}]"
# (run file, overrides, shards, the instant-op statuses the compiled run must reach)
CASES = [
    ("megatron-22b-8gpu", ["training.recompute=full"], 1, {k.ST_IBLOCK}),
    ("megatron-22b-8gpu", ["training.recompute=full", "engine.max_ops_ahead=2"], 1, {k.ST_IRESUME, k.ST_IBLOCK}),
    ("megatron-22b-8gpu", ["training.recompute=full", "engine.max_ops_ahead=3", SLOW_5], 2,
     {k.ST_IRESUME, k.ST_IBLOCK}),
    ("megatron-22b-8gpu", ["training.recompute=selective", "engine.max_ops_ahead=5"], 1, set()),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "training.recompute=full", "engine.max_ops_ahead=5"],
     2, {k.ST_IRESUME, k.ST_IBLOCK}),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "training.recompute=full", "parallel.virtual_stages=1",
                             "engine.max_ops_ahead=2"], 4, {k.ST_IRESUME, k.ST_IBLOCK}),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "training.recompute=selective"], 4, {k.ST_IBLOCK}),
    ("megatron-1t-3072gpu", ["training.global_batch_size=12"], 2, {k.ST_IBLOCK}),
    ("megatron-1t-3072gpu", ["training.global_batch_size=12", "engine.max_ops_ahead=3", SLOW_5], 4,
     {k.ST_IRESUME, k.ST_IBLOCK}),
    # out of memory at a rebuilt layer's alloc inside a backward block: the same error line
    ("megatron-22b-8gpu", ["training.recompute=full", "training.micro_batch_size=16",
                           "training.global_batch_size=16", "training.seq_length=16384"], 1, {k.ST_OOM}),
]  # fmt: skip


@pytest.fixture
def statuses(monkeypatch):
    """The instant-op statuses OpCore.instant_stop handled, and how many blocks with memory rows
    the kernels took: launched by the program (OpCore.launch) or from a tape (OpCore.begin_step:
    with one stage every step is the first and last stage's, all taped)."""
    seen = {"memory_blocks": 0}
    stop, launch, begin_step = OpCore.instant_stop, OpCore.launch, OpCore.begin_step

    def stopping(self, gpu, status, t):
        seen[status] = seen.get(status, 0) + 1
        return stop(self, gpu, status, t)

    def launching(self, gpu, block, memory=None):
        done = launch(self, gpu, block, memory)
        seen["memory_blocks"] += bool(done and memory)
        return done

    def stepping(self, gpu, known, memory, after):
        seen["memory_blocks"] += known[4] is not None  # (its memory rows)
        return begin_step(self, gpu, known, memory, after)

    monkeypatch.setattr(OpCore, "instant_stop", stopping)
    monkeypatch.setattr(OpCore, "launch", launching)
    monkeypatch.setattr(OpCore, "begin_step", stepping)
    return seen


# -m slow: the 3072-GPU straggler on 4 shards (~10 s, as long as the other nine together); case 2
# (the straggler, max_ops_ahead 3, 2 shards) and case 7 (the 3072-GPU run) take its paths by default
SLOW_CASES = {8}


@pytest.mark.parametrize("case", [pytest.param(i, marks=pytest.mark.slow) if i in SLOW_CASES else i
                                  for i in range(len(CASES))])  # fmt: skip
def test_blocks_with_memory_match_the_python_rules(case, statuses, tmp_path):
    name, overrides, shards, expected = CASES[case]
    assert_same_run_dirs(tmp_path, CONFIGS / "runs" / f"{name}.yaml", overrides, shards, trace="none")
    # (an out-of-memory error inside the first such block ends the run in its launch)
    assert statuses["memory_blocks"] or k.ST_OOM in statuses, "no block with an alloc or free ran in the kernels"
    assert expected <= set(statuses), (expected, statuses)


def test_an_out_of_memory_error_inside_a_block_lists_the_live_allocations(statuses, tmp_path):
    """The error the kernels stop with names the block's own allocation and the ones live before
    the block (OpCore._out_of_memory rebuilds the set up to the failing row)."""
    from tests.emulator.engine.test_opcore_fuzz import run_dir

    error, _ = run_dir(CONFIGS / "runs" / "megatron-22b-8gpu.yaml", CASES[-1][1], "compiled", tmp_path / "c",
                       trace="none")  # fmt: skip
    assert statuses.get(k.ST_OOM) == 1
    assert error[0] == "OutOfMemoryError"
    assert "allocating stage0.recomputed_layer" in error[1]
    assert "largest live: stage0.recomputed_layer" in error[1] and "stage0.activations.mb0.chunk0" in error[1]


class _FakeGPU:
    """Records what launch_prepared's op-by-op path calls (the compiled engine declines)."""

    def __init__(self):
        self.calls = []

    def launch_block(self, block, memory=None, suffix=""):
        return False

    def launch_compute(self, name, ns, flops):
        self.calls.append(("compute", name))

    def alloc(self, size, name):
        self.calls.append(("alloc", name, size))
        return (name, size)

    def free(self, block):
        self.calls.append(("free", block))


def test_launch_prepared_runs_memory_rows_op_by_op():
    """The Python path of a block with memory rows: an alloc names itself or takes its slot's name
    and puts the allocation there; a free frees its slot's."""
    gpu = _FakeGPU()
    block = [("a", 0, 5, "rebuilt"), ("c", "layer", 10, 1.0), ("f", 0, 5, None), ("a", 1, 7, None),
             ("c", "layer", 10, 1.0), ("f", 1, 7, None), ("f", 2, 3, None)]  # fmt: skip
    memory = [None, "activations", ("held", 3)]
    launch_prepared(gpu, block, " mb0", memory)
    assert gpu.calls == [("alloc", "rebuilt", 5), ("compute", "layer mb0"), ("free", ("rebuilt", 5)),
                         ("alloc", "activations", 7), ("compute", "layer mb0"), ("free", ("activations", 7)),
                         ("free", ("held", 3))]  # fmt: skip
    assert memory == [("rebuilt", 5), ("activations", 7), ("held", 3)]

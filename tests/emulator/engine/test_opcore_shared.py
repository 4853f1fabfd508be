"""The compiled per-op engine's plans and templates shared by the members of a tensor group
(OpCore._plan): one row per group call instead of one per member, the same results."""

from __future__ import annotations

import dataclasses

import pytest

from emulator.config.loader import load_run
from emulator.engine import opcore
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS

# unfolded: every member of the 8-rank tensor groups runs its own program; stages 1 and 2 run plain
# steps (tape.py); rank 21, of stage 1, is slow (its blocks keep templates of their own: their
# durations as launched)
RUN = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
OVERRIDES = [
    "parallel.pipeline=4", "parallel.virtual_stages=1", "parallel.data=2", "training.global_batch_size=16",
    "model.num_layers=4", "engine.fold_tensor_groups=false", "faults.slow_gpu=[{ranks: [21], factor: 0.9}]",
]  # fmt: skip


@pytest.fixture
def cores(monkeypatch):
    """The op cores a run made."""
    made = []
    init = opcore.OpCore.__init__

    def recording(self, shard):
        init(self, shard)
        made.append(self)

    monkeypatch.setattr(opcore.OpCore, "__init__", recording)
    return made


def _run(engine: str):
    config = load_run(RUN, [*OVERRIDES, f"engine.op_engine={engine}"])
    summary, result, _ = execute(config)
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


def test_a_tensor_group_shares_its_plans_and_templates(cores):
    compiled = _run("compiled")
    (core,) = [c for c in cores if c.n_pl]  # (warm_up makes one of its own)
    # the kernels' rows are one per group call; the members launch the blocks the group's first
    # member prepared (training's run_segments and step_parts), hence plan its calls only (plan_of)
    assert core.n_pl and len(core.plan_of) == core.n_pl
    assert len(core.plan_info) == core.n_pl == len(core.plan_alike)
    # blocks: one template per tensor group and block kind, and rank 5's own (its durations)
    groups = 64 // 8
    kinds = {b for key, (_, b, *_rest) in core.blocks.items() if b >= 0}
    assert core.n_tp == len(kinds) < 8 * groups * 4
    # a forward's block (its activations' alloc, then its layer, and the embedding or the logits of
    # the first and last stage: training.step_block): a plain step's one per tensor group, which its
    # members share (training.step_parts), and the slow rank's own entry
    steps = [key for key, (block, *_rest) in core.blocks.items() if len(block) > 1 and block[0][0] == "a"]
    assert len(steps) == groups + 1 and sum(type(key) is tuple for key in steps) == 1
    # the same run as the Python rules, which plan every member's call apart
    assert compiled == _run("python")

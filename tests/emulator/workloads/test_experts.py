"""Mixture of experts and expert parallelism (emulator/workloads/experts.py): the all-to-all sizes
with top-k, the expert groups, the weights each rank holds, seeded imbalance, the same results on
1, 2 and 4 shards (Ray: tests/actors/test_ray_backend.py)."""

from __future__ import annotations

import pytest

from emulator.backends.inline import run_inline
from emulator.config.loader import load_run
from emulator.engine.result import fingerprint
from emulator.errors import ConfigError
from emulator.runner.sequence import execute
from emulator.workloads import experts as ex
from emulator.workloads import layer_costs as lc
from emulator.workloads.layout import ParallelLayout
from emulator.workloads.memory import stage_memory
from emulator.workloads.segments import layer_shape
from netmodel.topology import Topology
from tests.conftest import CONFIGS

MIXTRAL = CONFIGS / "runs" / "mixtral-8x7b-ep8-64gpu.yaml"
# 4 layers on 2 nodes: PP 2 x DP 8, EP 8 (one expert per rank)
SMALL = ["cluster.nodes=2", "parallel.pipeline=2", "parallel.data=8", "model.num_layers=4",
         "training.global_batch_size=16", "training.seq_length=1024"]  # fmt: skip


def test_dispatch_is_tokens_times_top_k_times_hidden():
    shape = layer_shape(load_run(MIXTRAL))  # b 1, s 4096, h 4096, top-2, bf16, no TP
    assert ex.dispatch_bytes(shape) == 4096 * 2 * 4096 * 2
    ops = lc.forward_ops(shape)
    a2a = [(op.name, op.size_bytes, op.group) for op in ops if op.collective == "all_to_all"]
    assert a2a == [("moe.dispatch.all_to_all", ex.dispatch_bytes(shape), "ep"),
                   ("moe.combine.all_to_all", ex.dispatch_bytes(shape), "ep")]  # fmt: skip
    backward = [op.name for op in lc.backward_ops(shape) if op.collective == "all_to_all"]
    assert backward == ["moe.combine.all_to_all.backward", "moe.dispatch.all_to_all.backward"]


def test_expert_gemms_follow_the_routed_tokens():
    """Each of a rank's tokens goes to k experts: the expert GEMMs carry k times a dense MLP's
    tokens (8 experts of 14336, top-2: twice Mistral-7B's MLP FLOPs per token)."""
    shape = layer_shape(load_run(MIXTRAL))
    fc1 = next(op for op in lc.forward_ops(shape) if op.name == "moe.experts.fc1")
    assert fc1.flops == 2 * (4096 * 2) * 4096 * (2 * 14336)
    heavy = layer_shape(load_run(MIXTRAL), expert_load=1.5)
    heavy_fc1 = next(op for op in lc.forward_ops(heavy) if op.name == "moe.experts.fc1")
    assert heavy_fc1.flops == pytest.approx(1.5 * fc1.flops)


def test_expert_weights_split_over_expert_parallel_ranks():
    shape = layer_shape(load_run(MIXTRAL))
    per_expert = 3 * 4096 * 14336
    assert ex.expert_params_per_rank(shape) == per_expert  # 8 experts over EP 8
    assert lc.layer_params(shape) - lc.dense_params_per_rank(shape) == 8 * per_expert  # all 8, whole layer
    # Mixtral 8x7B: 46.7B parameters (Jiang et al. 2024)
    total = 32 * lc.layer_params(shape) + 2 * 32000 * 4096
    assert total == pytest.approx(46.7e9, rel=0.01)


def test_expert_groups_tile_the_stage():
    layout = ParallelLayout(tensor=2, data=8, pipeline=1)
    assert layout.expert_group(0, 4, 2) == (0, 2, 4, 6)
    assert layout.expert_tensor_group(3, 4, 2) == (2, 3)
    assert layout.expert_data_group(3, 4, 2) == (3, 11)


def test_imbalance_is_seeded_with_mean_one_and_capped():
    loads = ex.expert_loads(8, 0.5, seed=3)
    assert loads == ex.expert_loads(8, 0.5, seed=3) != ex.expert_loads(8, 0.5, seed=4)
    assert sum(loads) / 8 == pytest.approx(1.0)
    assert ex.expert_loads(8, 0.0, seed=3) == (1.0,) * 8
    assert ex.processed_load(1.7, 1.25) == 1.25 and ex.processed_load(0.8, 1.25) == 0.8


def test_imbalance_slows_the_iteration():
    even = execute(load_run(MIXTRAL, [*SMALL, "training.moe_imbalance=0"]))[0]
    skewed = execute(load_run(MIXTRAL, [*SMALL, "training.moe_imbalance=1.0"]))[0]
    assert skewed["iteration_time_s"] > even["iteration_time_s"]
    assert skewed["wait_fraction_by_dimension"]["expert"] > even["wait_fraction_by_dimension"]["expert"]


def test_moe_run_sends_the_all_to_alls_and_fits():
    config = load_run(MIXTRAL, SMALL)
    summary, result, _ = execute(config)
    assert summary["status"] == "completed" and "all_to_all" in result.kind_hist
    memory = stage_memory(load_run(MIXTRAL), 0)
    assert memory.peak_bytes < memory.capacity_bytes


@pytest.mark.parametrize("shards", [2, 4])
def test_moe_identical_on_any_shard_count(shards):
    config = load_run(MIXTRAL, SMALL)
    topo = Topology(config.cluster)
    assert fingerprint(run_inline(config, topo, shards)) == fingerprint(run_inline(config, topo, 1))


def test_expert_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"parallel.expert \(3\) must divide model.num_experts \(8\)"):
        load_run(MIXTRAL, ["parallel.expert=3"])
    with pytest.raises(ConfigError, match=r"parallel.expert \(2\) needs a model with experts"):
        load_run(CONFIGS / "runs" / "llama3-8b-64gpu.yaml", ["parallel.expert=2"])
    with pytest.raises(ConfigError, match="zero_stage 3 with experts is not modelled"):
        load_run(MIXTRAL, ["parallel.zero_stage=3"])
    with pytest.raises(ConfigError, match=r"model.moe_top_k \(9\) must be at most num_experts \(8\)"):
        load_run(MIXTRAL, ["model.moe_top_k=9"])

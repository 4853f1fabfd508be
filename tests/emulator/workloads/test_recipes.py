"""Today's recipes in the built-in workload: context parallelism, FSDP / ZeRO-3 with hybrid
sharding, the distributed optimizer's overlaps and bf16 gradient reduction, TP communication
overlap, fused attention. Closed forms of what each exchanges, and the same results on 1, 2 and 4
shards (Ray: tests/actors/test_ray_backend.py)."""

from __future__ import annotations

import pytest

from emulator.backends.inline import run_inline
from emulator.config.loader import load_run
from emulator.engine.result import fingerprint
from emulator.errors import ConfigError
from emulator.runner.sequence import execute
from emulator.workloads import layer_costs as lc
from emulator.workloads.context_parallel import kv_bytes_sent_per_rank, kv_gather_bytes
from emulator.workloads.data_parallel import param_gather_buckets, zero3_gather_bytes
from emulator.workloads.layout import ParallelLayout
from emulator.workloads.memory import stage_memory, zero3_root_params
from emulator.workloads.segments import layer_shape
from netmodel.topology import Topology
from tests.conftest import CONFIGS
from tests.emulator.workloads.collectives import collective_calls

RUNS = CONFIGS / "runs"
CP_RUN = RUNS / "llama31-70b-cp-64gpu.yaml"
ZERO3_RUN = RUNS / "llama3-70b-zero3-64gpu.yaml"
# a small context-parallel run: TP 8 x CP 2 x PP 2 on 4 H100 nodes, 4 Llama-70B layers
SMALL_CP = ["cluster.nodes=4", "parallel.tensor=8", "parallel.pipeline=2", "parallel.data=1",
            "parallel.virtual_stages=1", "model.num_layers=4", "training.seq_length=4096",
            "training.global_batch_size=4"]  # fmt: skip
SMALL_ZERO3 = ["cluster.nodes=4", "parallel.data=32", "model.num_layers=2", "training.seq_length=1024",
               "training.global_batch_size=32"]  # fmt: skip


def _sizes(result, kind: str) -> dict[int, int]:
    return result.kind_hist.get(kind, {})


def test_layout_puts_context_next_to_tensor():
    """Megatron-Core order tp-cp-dp-pp: context peers t apart, data peers t*c apart, gradients over both."""
    layout = ParallelLayout(tensor=4, data=2, pipeline=2, context=2)
    assert layout.world_size == 32
    assert layout.tensor_group(5) == (4, 5, 6, 7)
    assert layout.context_group(5) == (1, 5)
    assert layout.data_group(5) == (5, 13)
    assert layout.gradient_group(5) == (1, 5, 9, 13)
    assert layout.pipeline_group(5) == (5, 21)
    assert layout.stage_of(16) == 1
    assert layout.shard_group(13, 2) == (9, 13) and layout.replica_group(13, 2) == (5, 13)


def test_kv_exchange_closed_form():
    """K/V of the whole sequence for this tensor rank's K/V heads: 2*b*s*(g/t)*d*e; a ring sends
    (c-1)/c of it forward, twice that backward."""
    config = load_run(CP_RUN)  # Llama 3 70B: 8 K/V heads, head size 128; TP 4, CP 2, s 8192, bf16
    shape = layer_shape(config)
    assert kv_gather_bytes(shape) == 2 * 1 * 8192 * (8 // 4) * 128 * 2
    assert kv_bytes_sent_per_rank(shape) == kv_gather_bytes(shape) // 2
    assert kv_bytes_sent_per_rank(shape, forward=False) == kv_gather_bytes(shape)
    forward = [op for op in lc.forward_ops(shape) if op.group == "cp"]
    backward = [op for op in lc.backward_ops(shape) if op.group == "cp"]
    expected = [("all_gather", kv_gather_bytes(shape), True)]
    assert [(op.collective, op.size_bytes, op.overlap) for op in forward] == expected
    assert [(op.collective, op.overlap) for op in backward] == [("all_gather", True), ("reduce_scatter", True)]
    gathered = load_run(CP_RUN, ["parallel.context_algo=all_gather"])
    ops = lc.backward_ops(layer_shape(gathered))
    assert [(op.collective, op.overlap) for op in ops if op.group == "cp"] == [("all_gather", False),
                                                                               ("reduce_scatter", False)]
    names = [op.name for op in ops]  # the gradients reduce-scattered after the attention backward
    assert names.index("attention.flash.backward") < names.index("attention.cp_dkv.reduce_scatter")


def test_context_parallel_divides_tokens_and_activations():
    base = load_run(CP_RUN, ["parallel.context=1", "parallel.data=4"])
    cp = load_run(CP_RUN)
    flops = [sum(op.flops for op in lc.forward_ops(layer_shape(c)) if op.kind == "matmul") for c in (base, cp)]
    assert flops[1] == pytest.approx(flops[0] / 2)
    attention = [sum(op.flops for op in lc.forward_ops(layer_shape(c)) if op.kind == "attention") for c in (base, cp)]
    assert attention[1] == pytest.approx(attention[0] / 2)  # load-balanced causal: 1/c of the work each
    assert stage_memory(cp, 0).activation_bytes_per_chunk * 2 == stage_memory(base, 0).activation_bytes_per_chunk


def test_context_parallel_run_exchanges_the_kv_bytes():
    """Every layer, forward and backward, all-gathers K/V in the context group (2 ranks in two nodes:
    message level, one message of half the buffer per member), and backward reduce-scatters their
    gradients: counted in the message-size histogram's bucket of that half."""
    config = load_run(CP_RUN, SMALL_CP)
    summary, result, _ = execute(config)
    assert summary["status"] == "completed"
    size = kv_gather_bytes(layer_shape(config))
    assert size == 2 * 4096 * 1 * 128 * 2  # 8 K/V heads over TP 8: one per rank
    bucket = (size // 2).bit_length() - 1  # log2 buckets; no other message falls in this one
    ranks, layers_per_rank, micro = 32, 2, 4
    assert result.kind_hist["all_gather"][bucket] == 2 * ranks * layers_per_rank * micro
    assert result.kind_hist["reduce_scatter"][bucket] == ranks * layers_per_rank * micro


def test_context_size_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"training.seq_length \(1000\) must be divisible by 2 \* context\(2\) "
                                          r"\* tensor\(4\) \(sequence parallel\) = 16"):  # fmt: skip
        load_run(CP_RUN, ["training.seq_length=1000"])
    with pytest.raises(ConfigError, match=r"^parallel.context must be >= 1, got 0$"):
        load_run(CP_RUN, ["parallel.context=0"])


@pytest.mark.parametrize("shards", [2, 4])
def test_context_parallel_identical_on_any_shard_count(shards):
    config = load_run(CP_RUN, SMALL_CP)
    topo = Topology(config.cluster)
    assert fingerprint(run_inline(config, topo, shards)) == fingerprint(run_inline(config, topo, 1))


def test_zero3_gathers_one_layer_and_reduce_scatters_its_gradients():
    """FSDP2: the all-gather is a layer's 16-bit weights (not times the group), before forward and
    backward; a reduce-scatter of its gradients after each backward, every microbatch; the root
    unit (embedding, output layer, final norm) gathered once and reduce-scattered once per microbatch."""
    config = load_run(ZERO3_RUN, SMALL_ZERO3)
    shape = layer_shape(config)
    layer_weights = lc.layer_params_per_rank(shape) * 2
    assert zero3_gather_bytes(lc.layer_params_per_rank(shape), "bf16") == layer_weights
    root = zero3_root_params(config, 0)
    m = config.model
    assert root == 2 * m.vocab_size * m.hidden_size + m.hidden_size  # untied embedding and output, RMSNorm
    micro, layers = 1, 2
    calls = collective_calls(config)
    assert calls == {("all_gather", layer_weights): 2 * layers * micro, ("all_gather", 2 * root): micro,
                     ("reduce_scatter", layer_weights * 2): layers * micro,  # fp32 gradients
                     ("reduce_scatter", 4 * root): micro}  # fmt: skip


def test_the_70b_zero3_gather_fits_where_it_was_refused():
    """The 70B ZeRO-3 recipe on 64 A100s: a ~1.7 GB gather per layer, not 103 GB (the old size)."""
    config = load_run(ZERO3_RUN)
    size = zero3_gather_bytes(lc.layer_params_per_rank(layer_shape(config)), "bf16")
    assert 1.6e9 < size < 1.8e9
    memory = stage_memory(config, 0)
    assert memory.peak_bytes < memory.capacity_bytes


def test_hybrid_sharding_reduces_within_and_all_reduces_across():
    config = load_run(ZERO3_RUN, [*SMALL_ZERO3, "parallel.zero_shard_group=8"])
    full = load_run(ZERO3_RUN, SMALL_ZERO3)
    assert stage_memory(config, 0).params_bytes == pytest.approx(stage_memory(full, 0).params_bytes * 4, rel=1e-3)
    _, result, _ = execute(config)
    assert "all_reduce" in result.kind_hist  # the shard across the 4 replicas
    with pytest.raises(ConfigError, match=r"parallel.zero_shard_group \(5\) must divide data\(32\)"):
        load_run(ZERO3_RUN, [*SMALL_ZERO3, "parallel.zero_shard_group=5"])
    with pytest.raises(ConfigError, match="zero_shard_group needs zero_stage 3"):
        load_run(ZERO3_RUN, [*SMALL_ZERO3, "parallel.zero_shard_group=8", "parallel.zero_stage=2"])


def test_bf16_gradient_reduction_halves_the_gradients_and_fits_nvidias_175b_recipe():
    """NVIDIA's GPT-3 175B recipe (TP 4, PP 8, 12 virtual stages, no recompute) on 80 GB H100s."""
    recipe = load_run(RUNS / "gpt3-175b-nvidia-128gpu.yaml")
    fp32 = load_run(RUNS / "gpt3-175b-nvidia-128gpu.yaml", ["training.grad_reduce_dtype=fp32"])
    assert stage_memory(recipe, 0).grads_bytes * 2 == stage_memory(fp32, 0).grads_bytes
    assert all(stage_memory(recipe, s).peak_bytes < stage_memory(recipe, s).capacity_bytes for s in range(8))
    # the 2022 kernels keep the s x s attention scores: 105 GiB, out of memory
    unfused = load_run(RUNS / "gpt3-175b-nvidia-128gpu.yaml", ["training.attention=unfused"])
    assert stage_memory(unfused, 0).peak_bytes > stage_memory(unfused, 0).capacity_bytes


def test_overlap_param_gather_off_is_the_gather_after_the_step():
    """With the overlap off, ZeRO 1-2 runs give the results they gave before it existed (b6dd35e)."""
    config = load_run(RUNS / "bloom-560m-zero2.yaml", ["parallel.overlap_param_gather=false"])
    summary = execute(config)[0]
    assert summary["fingerprint"] == "4c4748a07e64731ae9128fceba519c9b"
    overlapped = execute(load_run(RUNS / "bloom-560m-zero2.yaml"))[0]
    assert overlapped["iteration_time_s"] < summary["iteration_time_s"]


def test_param_gather_buckets_close_at_the_bucket_size():
    assert param_gather_buckets(4, 30, 50, extra_bytes=10) == [(0, 70), (2, 60)]
    assert param_gather_buckets(3, 100, 50) == [(0, 100), (1, 100), (2, 100)]


def test_grad_reduce_after_the_backward_is_slower():
    base = ["training.global_batch_size=128", "training.iterations=1"]
    overlapped = execute(load_run(RUNS / "bloom-560m-zero2.yaml", base))[0]
    late = execute(load_run(RUNS / "bloom-560m-zero2.yaml", [*base, "parallel.overlap_grad_reduce=false"]))[0]
    assert late["iteration_time_s"] > overlapped["iteration_time_s"]


def test_tp_comm_overlap_runs_each_collective_beside_its_gemm():
    config = load_run(CP_RUN, ["parallel.context=1", "parallel.data=4"])
    ops = lc.forward_ops(layer_shape(config))
    tp = [i for i, op in enumerate(ops) if op.group == "tp" and op.kind == "comm"]
    assert tp and all(ops[i].overlap for i in tp)
    for i in tp:  # each is followed by the GEMM it runs beside
        assert ops[i + 1].kind == "matmul", ops[i].name
    plain = load_run(CP_RUN, ["parallel.context=1", "parallel.data=4", "parallel.tp_comm_overlap=false"])
    assert not any(op.overlap for op in lc.forward_ops(layer_shape(plain)) if op.group == "tp")
    with pytest.raises(ConfigError, match="tp_comm_overlap needs tensor > 1 and sequence_parallel"):
        load_run(CP_RUN, ["parallel.sequence_parallel=false"])


def test_flash_attention_keeps_no_square_and_skips_the_masked_half():
    flash = load_run(CP_RUN)
    unfused = load_run(CP_RUN, ["training.attention=unfused"])
    att = [sum(op.flops for op in lc.forward_ops(layer_shape(c)) if op.kind == "attention") for c in (flash, unfused)]
    assert att[0] == pytest.approx(att[1] * lc.CAUSAL_FRACTION)
    b, s, h, t, c = 1, 8192, 8192, 4, 2
    # Llama 3 70B (GQA 8 of 64 heads, SwiGLU of 3.5h, no dropout), sequence parallel: Korthikanti's
    # Table 2 terms for this layer, 8 replicated (norms, GEMM inputs) + 2 (Q) + 4 * 8/64 (K, V) + 2
    # (out_proj input) + 3 * 2 * 3.5 (fc1's two halves, fc2's input), all over t; no s x s term
    per_sbh = 8 + 2 + 4 * 8 / 64 + 2 + 3 * 2 * 3.5
    assert stage_memory(flash, 1).activation_bytes_per_chunk == 4 * int(s // c * b * h * per_sbh / t)
    squares = 2 * 64 * s / h  # without dropout only the softmax output of the s x s scores stays
    assert stage_memory(unfused, 1).activation_bytes_per_chunk == 4 * int(s // c * b * h * (per_sbh + squares) / t)


def test_context_ranks_move_their_own_tokens_only():
    """Under context parallelism a rank holds b*s/c tokens: its tensor-parallel collectives, its
    pipeline messages and its fp32 logits are sized by them, not by the whole sequence (a CP 16 run
    of 128K tokens otherwise all-gathers 4 GB per layer norm)."""
    from emulator.workloads.memory import logits_bytes
    from emulator.workloads.pipeline import message_bytes

    config = load_run(CP_RUN)  # TP 4 x CP 2, sequence parallel, 8K tokens, bf16
    b, s, h, t, c, vocab = 1, 8192, 8192, 4, 2, 128256
    ops = {op.name: op for op in lc.forward_ops(layer_shape(config))}
    assert ops["ln1.all_gather"].size_bytes == b * s // c * h * 2
    assert ops["attention.out_proj.tp_reduce"].size_bytes == b * s // c * h * 2
    assert message_bytes(config) == b * s // c * h * 2 // t
    assert logits_bytes(config) == 4 * b * s // c * (vocab // t)
    whole = load_run(CP_RUN, ["parallel.context=1", "parallel.data=4"])
    assert {op.name: op for op in lc.forward_ops(layer_shape(whole))}["ln1.all_gather"].size_bytes == b * s * h * 2

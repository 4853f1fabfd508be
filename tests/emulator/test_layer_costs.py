"""Per-layer op decomposition: FLOP counts, collective placement, and calibration to Korthikanti 2022."""

import pytest

from emulator.errors import ConfigError
from emulator.hardware.compute import op_duration_ns
from emulator.hardware.gpus import get_gpu
from emulator.workloads.layer_costs import (
    LayerShape,
    backward_ops,
    embedding_and_logits_ops,
    forward_ops,
    layer_params,
    layer_params_per_rank,
    model_params,
    optimizer_step_ops,
)

A100 = get_gpu("a100-sxm-80gb")
# published.yaml nccl_tests: 8x A100 SXM NVSwitch all_reduce busbw, 230 GB/s; a small NCCL latency.
BUSBW_BYTES_PER_S = 230e9
NCCL_LATENCY_S = 10e-6


def shape_22b(sequence_parallel: bool = False) -> LayerShape:
    return LayerShape(6144, 64, 2048, 4, tensor_parallel=8, sequence_parallel=sequence_parallel)


def llama3_8b(tensor_parallel: int = 1) -> LayerShape:
    return LayerShape(4096, 32, 8192, 1, 14336, 8, gated_mlp=True, tensor_parallel=tensor_parallel, bias=False)


def tp_collective_s(collective: str, size_bytes: int, t: int) -> float:
    """nccl-tests ring time: busbw factor 2(t-1)/t for all_reduce, (t-1)/t for the others."""
    factor = 2 * (t - 1) / t if collective == "all_reduce" else (t - 1) / t
    return NCCL_LATENCY_S + factor * size_bytes / BUSBW_BYTES_PER_S


def ops_ms(ops, t: int = 8) -> float:
    """Ops run one after another: compute by the roofline, TP collectives analytically."""
    total_s = 0.0
    for op in ops:
        if op.kind == "comm":
            total_s += tp_collective_s(op.collective, op.size_bytes, t)
        else:
            total_s += op_duration_ns(A100, op.flops, op.bytes_moved, op.kind) * 1e-9
    return total_s * 1e3


def flops(ops) -> float:
    return sum(op.flops for op in ops)


def test_175b_layer_mfu_is_plausible():
    """Uncalibrated check: the 175B layer (selective + SP) runs at a model-FLOPs utilisation of 0.4-0.7."""
    h, s, b, t = 12288, 2048, 1, 8
    shape = LayerShape(h, 96, s, b, tensor_parallel=t, sequence_parallel=True)
    time_s = (ops_ms(forward_ops(shape)) + ops_ms(backward_ops(shape, "selective"))) * 1e-3
    model_flops = 72 * b * s * h**2 * (1 + s / (6 * h)) / t  # Korthikanti App. A, one layer, one rank
    assert 0.4 < model_flops / (time_s * 312e12) < 0.7


def test_gpt_flops_match_published_formulas():
    """Per layer and rank: model FLOPs 72bsh^2(1+s/6h)/t; full recompute 96bsh^2(1+s/6h)/t (Narayanan eq. 3)."""
    h, s, b, t = 6144, 2048, 4, 8
    shape = shape_22b()
    fwd = flops(forward_ops(shape))
    assert fwd == pytest.approx(24 * b * s * h**2 * (1 + s / (6 * h)) / t)
    assert fwd + flops(backward_ops(shape)) == pytest.approx(72 * b * s * h**2 * (1 + s / (6 * h)) / t)
    assert fwd + flops(backward_ops(shape, "full")) == pytest.approx(96 * b * s * h**2 * (1 + s / (6 * h)) / t)
    # Selective recompute reruns only the score and context GEMMs: 4*b*s^2*h/t more.
    extra = flops(backward_ops(shape, "selective")) - flops(backward_ops(shape))
    assert extra == pytest.approx(4 * b * s**2 * h / t)


def test_llama3_8b_gqa_swiglu_flops():
    """GQA narrows the QKV GEMM to h+2*kv*d; SwiGLU has three h x f GEMMs (llama3-8b layer)."""
    h, a, kv, f, s, b = 4096, 32, 8, 14336, 8192, 1
    d = h // a
    ops = {op.name: op for op in forward_ops(llama3_8b())}
    assert ops["qkv"].flops == 2 * b * s * h * (h + 2 * kv * d)
    assert ops["mlp.fc1"].flops == 2 * b * s * h * 2 * f  # gate and up projections fused
    assert ops["mlp.fc2"].flops == 2 * b * s * f * h
    expected = 2 * b * s * (h * (h + 2 * kv * d) + h * h + 3 * h * f) + 4 * b * s * s * h
    assert flops(ops.values()) == expected
    assert flops(forward_ops(llama3_8b(tensor_parallel=8))) == pytest.approx(expected / 8)


def test_llama3_8b_layer_params():
    """A llama3-8b layer has 218,103,808 matrix weights plus two RMSNorm weights (32 layers: 6.98B)."""
    assert layer_params(llama3_8b()) == 218_103_808 + 2 * 4096
    assert layer_params_per_rank(llama3_8b(8)) == 218_103_808 // 8 + 2 * 4096


@pytest.mark.parametrize("h,a,layers", [(6144, 64, 48), (12288, 96, 96), (20480, 128, 105)])
def test_gpt_parameter_count_formula(h, a, layers):
    """Model parameters equal P = 12*l*h^2 * (1 + 13/(12h) + (V+s)/(12*l*h)) (Narayanan eq. 2)."""
    vocab, s = 51200, 2048
    shape = LayerShape(h, a, s, 1)
    assert layer_params(shape) == 12 * h**2 + 13 * h
    expected = 12 * layers * h**2 * (1 + 13 / (12 * h) + (vocab + s) / (12 * layers * h))
    assert model_params(shape, layers, vocab) == pytest.approx(expected, rel=1e-12)


def test_per_rank_params_sum_to_layer_params():
    """TP ranks together hold the layer once, plus the replicated norms and row-parallel biases."""
    h, t = 6144, 8
    replicated = 4 * h + 2 * h  # two layernorms (weight + bias), out-proj and fc2 biases
    assert t * layer_params_per_rank(shape_22b()) == layer_params(shape_22b()) + (t - 1) * replicated


def test_tensor_parallel_collectives_without_sequence_parallelism():
    """Forward all-reduces after out-proj and fc2; backward after the QKV and fc1 input gradients."""
    shape = shape_22b()
    size = 4 * 2048 * 6144 * 2
    fwd = forward_ops(shape)
    comm = [(i, op) for i, op in enumerate(fwd) if op.kind == "comm"]
    assert [fwd[i - 1].name for i, _ in comm] == ["attention.out_proj", "mlp.fc2"]
    assert all(op.collective == "all_reduce" and op.size_bytes == size for _, op in comm)
    bwd = backward_ops(shape)
    comm = [(i, op) for i, op in enumerate(bwd) if op.kind == "comm"]
    assert [bwd[i - 1].name for i, _ in comm] == ["mlp.fc1.dgrad", "qkv.dgrad"]
    assert all(op.collective == "all_reduce" and op.size_bytes == size for _, op in comm)


def test_tensor_parallel_collectives_with_sequence_parallelism():
    """SP: all-gather before QKV and fc1, reduce-scatter after out-proj and fc2; the converse in backward."""
    shape = shape_22b(sequence_parallel=True)
    fwd = forward_ops(shape)
    # An all-gather feeds the next GEMM; a reduce-scatter reduces the previous one.
    seq = [
        (op.collective, fwd[i + 1].name if op.collective == "all_gather" else fwd[i - 1].name)
        for i, op in enumerate(fwd)
        if op.kind == "comm"
    ]
    assert seq == [
        ("all_gather", "qkv"),
        ("reduce_scatter", "attention.out_proj"),
        ("all_gather", "mlp.fc1"),
        ("reduce_scatter", "mlp.fc2"),
    ]
    bwd = backward_ops(shape)
    collectives = [op.collective for op in bwd if op.kind == "comm"]
    # fc2/out-proj grads all-gathered; QKV/fc1 inputs re-gathered for wgrad; their grads reduce-scattered.
    assert collectives.count("all_gather") == 4 and collectives.count("reduce_scatter") == 2
    assert all(op.size_bytes == 4 * 2048 * 6144 * 2 for op in bwd if op.kind == "comm")


def test_full_recompute_prepends_the_forward_with_its_collectives():
    """Full recompute = the whole forward (comm included) followed by the plain backward."""
    shape = shape_22b()
    fwd, bwd = forward_ops(shape), backward_ops(shape)
    full = backward_ops(shape, "full")
    assert [op.name for op in full] == [f"recompute.{op.name}" for op in fwd] + [op.name for op in bwd]


def test_no_collectives_without_tensor_parallelism():
    """With t == 1 no op is a collective, in any pass."""
    shape = LayerShape(4096, 32, 2048, 2, sequence_parallel=True)
    extra = embedding_and_logits_ops(shape, 50257)
    passes = [forward_ops(shape), backward_ops(shape, "full"), *vars(extra).values()]
    assert all(op.kind != "comm" for ops in passes for op in ops)


def test_embedding_and_logits():
    """Logits GEMM is 2*b*s*h*V/t per rank; its backward doubles it; the vocabulary is split over t."""
    shape = shape_22b()
    ops = embedding_and_logits_ops(shape, 51200)
    assert flops(ops.logits_forward) == 2 * 4 * 2048 * 6144 * 51200 / 8
    assert flops(ops.logits_backward) == 2 * flops(ops.logits_forward)
    assert flops(ops.embedding_forward) == 0 and flops(ops.embedding_backward) == 0
    assert [op.collective for op in ops.embedding_forward if op.kind == "comm"] == ["all_reduce"]


def test_optimizer_step_bytes():
    """Mixed-precision Adam moves 4 + 30 bytes per parameter, fp32 Adam 4 + 28."""
    assert sum(op.bytes_moved for op in optimizer_step_ops(1000, "bf16")) == 34_000
    assert sum(op.bytes_moved for op in optimizer_step_ops(1000, "fp32")) == 32_000
    with pytest.raises(ConfigError, match="'int4'"):
        optimizer_step_ops(10, "int4")


def test_invalid_shapes_and_modes_are_config_errors():
    """Indivisible heads, unknown recompute modes raise ConfigError naming the values."""
    with pytest.raises(ConfigError, match=r"num_attention_heads \(64\).*tensor_parallel \(6\)"):
        LayerShape(6144, 64, 2048, 1, tensor_parallel=6)
    with pytest.raises(ConfigError, match=r"'partial'.*none, selective, full"):
        backward_ops(shape_22b(), "partial")


def test_without_dropout_no_masks_and_no_dropout_kernels():
    """model.dropout: false (Llama-style): the unfused attention loses its dropout kernel (forward
    and backward) and every bias-dropout-add moves its 3 elements without the 1-byte mask."""
    from dataclasses import replace

    with_dropout = LayerShape(4096, 32, 2048, 1, tensor_parallel=2, sequence_parallel=True)
    without = replace(with_dropout, dropout=False)
    names = [op.name for op in forward_ops(with_dropout)]
    assert "attention.dropout" in names
    assert "attention.dropout" not in [op.name for op in forward_ops(without)]
    assert "attention.dropout.backward" not in [op.name for op in backward_ops(without)]
    add = {op.name: op.bytes_moved for op in forward_ops(with_dropout)}["mlp.bias_dropout_add"]
    add_without = {op.name: op.bytes_moved for op in forward_ops(without)}["mlp.bias_dropout_add"]
    tokens = 2048 // 2  # sequence parallel: this rank's share
    assert add - add_without == tokens * 4096 * 1  # the mask, one byte an element

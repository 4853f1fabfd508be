"""A model's operations turned into what a rank program launches: fused compute and collectives.

Consecutive compute ops run back to back on the compute stream, so one compute op with the sum of
their durations gives the same timeline with far fewer events; a segment boundary is kept wherever
a collective sits. Segments are computed once per GPU type and reused for every microbatch.

Segment kinds: ``("c", name, duration_ns, flops)`` compute; ``("m", name, collective, size_bytes,
overlapped, group)`` a collective of the tensor (``"tp"``) or context (``"cp"``) group; ``("w",)``
wait for the last overlapped collective.
Which collectives overlap, and how segments are launched and timed: tensor_parallel.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from emulator.hardware.compute import op_duration_ns
from emulator.workloads import layer_costs as lc
from emulator.workloads.tensor_parallel import is_overlapped, sequence_parallel

BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4}


def layer_shape(config, expert_load: float = 1.0) -> lc.LayerShape:
    """The layer of a run's model on one rank; ``expert_load``: the rank's share of the routed
    tokens in a MoE model (experts.py)."""
    m, p, t = config.model, config.parallel, config.training
    return lc.LayerShape(
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        seq_length=t.seq_length,
        micro_batch_size=t.micro_batch_size,
        ffn_hidden_size=m.ffn_size,
        num_kv_heads=m.query_groups,
        gated_mlp=m.swiglu,
        tensor_parallel=p.tensor,
        sequence_parallel=sequence_parallel(p),
        bytes_per_element=BYTES_PER_ELEMENT[t.precision],
        bias=m.add_bias_linear,
        context_parallel=p.context,
        context_algo=p.context_algo,
        flash_attention=t.attention == "flash",
        tp_comm_overlap=p.tp_comm_overlap,
        dropout=m.dropout,
        eager_kernels=t.kernels == "eager",
        rope=m.position_embedding == "rope",
        num_experts=m.experts,
        moe_top_k=m.moe_top_k,
        moe_ffn_hidden_size=m.moe_ffn_size if m.experts else 0,
        moe_shared_experts=m.moe_shared_experts,
        expert_parallel=p.expert,
        expert_tensor=(p.expert_tensor or p.tensor) if m.experts else 1,
        expert_load=expert_load if m.experts else 1.0,
    )


def to_segments(ops: list[lc.Op], spec, precision: str) -> list[tuple]:
    """Fuse compute ops between collectives; mark overlapped collectives and their wait points."""
    segments: list[tuple] = []
    names: list[str] = []
    duration = 0
    flops = 0.0
    wait_after_next = False

    def flush() -> None:
        nonlocal duration, flops, names
        if names:
            label = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
            segments.append(("c", label, duration, flops))
        names, duration, flops = [], 0, 0.0

    for op in ops:
        if op.kind == "comm":
            flush()
            overlapped = op.overlap or is_overlapped(op.name)
            segments.append(("m", op.name, op.collective, op.size_bytes, overlapped, op.group))
            wait_after_next = overlapped
            continue
        names.append(op.name)
        duration += op_duration_ns(spec, op.flops, op.bytes_moved, op.kind, precision)
        flops += op.flops
        if wait_after_next:
            flush()
            segments.append(("w",))
            wait_after_next = False
    flush()
    if wait_after_next:
        segments.append(("w",))
    return segments


@dataclass
class ModelSegments:
    """Everything one rank launches per microbatch, for one GPU type."""

    layer_forward: list[tuple]
    layer_backward: list[tuple]
    embedding_forward: list[tuple]
    embedding_backward: list[tuple]
    logits_forward: list[tuple]
    logits_backward: list[tuple]


def model_segments(config, spec, expert_load: float = 1.0) -> ModelSegments:
    shape = layer_shape(config, expert_load)
    precision = config.training.precision
    emb = lc.embedding_and_logits_ops(shape, config.model.vocab_size)

    def seg(ops):
        return to_segments(ops, spec, precision)

    return ModelSegments(
        layer_forward=seg(lc.forward_ops(shape)),
        layer_backward=seg(lc.backward_ops(shape, config.training.recompute)),
        embedding_forward=seg(emb.embedding_forward),
        embedding_backward=seg(emb.embedding_backward),
        logits_forward=seg(emb.logits_forward),
        logits_backward=seg(emb.logits_backward),
    )


def forward_flops_per_microbatch(config, causal: bool = False) -> float:
    """Model FLOPs of one microbatch's forward pass through the whole model (all TP and CP ranks).

    The convention of Megatron-LM's ``num_floating_point_operations`` and Korthikanti et al.: the
    attention's whole ``s x s`` square, whatever a causal kernel skips; ``causal``: only its
    unmasked half (the FLOPs a causal model needs, FlashAttention's and torchtitan's count)."""
    shape = replace(layer_shape(config), flash_attention=causal, context_parallel=1, expert_load=1.0)
    t = config.parallel.tensor
    layer = sum(op.flops for op in lc.forward_ops(shape)) * t
    emb = lc.embedding_and_logits_ops(shape, config.model.vocab_size)
    logits = sum(op.flops for op in emb.logits_forward) * t
    return config.model.num_layers * layer + logits

"""Data parallelism and ZeRO: what each rank of a data-parallel group holds, and what it sends.

    emulator run configs/runs/bloom-560m-zero2.yaml     # 32-way data parallel, ZeRO 2
    emulator run configs/runs/llama3-70b-zero3-64gpu.yaml   # FSDP (ZeRO-3) on 64 A100s

The one description of the technique that the emulated program (training.py), the closed-form
estimate (emulator/studies/estimate.py), the memory model (memory.py) and the planner (emulator/studies/plan.py)
share. Mixed-precision Adam as in Megatron-LM and ZeRO (Rajbhandari et al. 2020): 16-bit weights
(2 B per parameter), fp32 main gradients (4 B; 2 B for fp16), fp32 master weights with Adam's m and
v (12 B). ZeRO stage 1 partitions the optimizer states over the ``d`` ranks of the group, stage 2
the gradients too, stage 3 the weights too.

The group: the ranks that hold the same weights, data x context (layout.gradient_group).
Gradients are reduced over it; ZeRO 1-2 partition over all of it, ZeRO-3 over groups of
``parallel.zero_shard_group`` of its ranks (hybrid sharding), replicated across them.

Traffic, ZeRO 0-2 (Megatron-Core's distributed data parallel): during the last microbatch's
backward the gradients are reduced in buckets of ``parallel.bucket_size_mb`` as layers fill them
(``overlap_grad_reduce``; else every bucket after the backward): all-reduce, or reduce-scatter with
ZeRO >= 1, each rank keeping its shard. ZeRO 1-2 then all-gather the updated 16-bit weights: after
the optimizer step, or with ``overlap_param_gather`` bucket by bucket during the next iteration's
first forward, each bucket waited for before its first layer (an emulated iteration is the steady
state: it starts with the gathers of the step before).

ZeRO-3 as FSDP2 runs it (``fully_shard`` per layer, Zhao et al. 2023): one all-gather of a layer's
whole 16-bit weights (the gathered buffer, not times the group) before its forward and again before
its backward, prefetched one layer ahead; a reduce-scatter of the layer's gradients after its
backward, every microbatch (the gradients are sharded, so they cannot wait for the last one); with
hybrid sharding the reduce-scatter runs in the shard group and the shard is then all-reduced
across the replicas.

Gradient dtype: fp32 main gradients as Megatron keeps them (2 B under fp16), or bf16
(``training.grad_reduce_dtype``, NVIDIA's H100 recipes): the buffer and every reduction halve.
"""

from __future__ import annotations

from emulator.workloads import layer_costs as lc
from emulator.workloads.segments import to_segments

MiB = 1 << 20
ZERO_STAGES = (0, 1, 2, 3)


def zero_stages(data: int) -> tuple[int, ...]:
    """The ZeRO stages worth telling apart for a data-parallel size (one rank partitions nothing)."""
    return ZERO_STAGES if data > 1 else (0,)


def weight_bytes_per_param(precision: str) -> int:
    """The model's weights: 16-bit copies, fp32 when training in fp32."""
    return 4 if precision == "fp32" else 2


def grad_bytes_per_param(precision: str, grad_reduce_dtype: str | None = None) -> int:
    """Gradients: fp32 main gradients (Megatron accumulates in fp32), 16-bit under fp16, or the
    ``training.grad_reduce_dtype`` given."""
    if grad_reduce_dtype is not None:
        return 2 if grad_reduce_dtype == "bf16" else 4
    return 2 if precision == "fp16" else 4


def config_grad_bytes(config) -> int:
    """Bytes of one parameter's gradient in a run (precision and ``training.grad_reduce_dtype``)."""
    t = config.training
    return grad_bytes_per_param(t.precision, t.grad_reduce_dtype)


def replicas(config) -> int:
    """Ranks holding the same weights: data x context (layout.gradient_group)."""
    return config.parallel.data * config.parallel.context


def expert_replicas(config) -> int:
    """Ranks holding the same expert weights: a stage's ``t * c * d`` over ``expert * expert_tensor``."""
    p = config.parallel
    return p.tensor * p.context * p.data // (p.expert * (p.expert_tensor or p.tensor))


def shard_size(config) -> int:
    """Ranks one copy of the model states is partitioned over: ``zero_shard_group`` under ZeRO-3
    (hybrid sharding), else the whole gradient group."""
    p = config.parallel
    return p.zero_shard_group if p.zero_stage >= 3 and p.zero_shard_group else replicas(config)


def optimizer_bytes_per_param(precision: str) -> int:
    """Adam's states: fp32 master weights, m and v (12 B); no master copy in fp32 training (8 B)."""
    return 8 if precision == "fp32" else 12


def model_state_bytes(params: int, precision: str, zero_stage: int, data: int,
                      grad_bytes: int | None = None) -> tuple[int, int, int]:  # fmt: skip
    """(weights, gradients, optimizer states) bytes on one rank holding ``params`` parameters before
    partitioning, partitioned over ``data`` ranks at ``zero_stage``; ``grad_bytes`` per parameter
    (default: :func:`grad_bytes_per_param` of the precision)."""
    grad_bytes = grad_bytes or grad_bytes_per_param(precision)
    weights = params * weight_bytes_per_param(precision) // (data if zero_stage >= 3 else 1)
    grads = params * grad_bytes // (data if zero_stage >= 2 else 1)
    optimizer = params * optimizer_bytes_per_param(precision) // (data if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def optimizer_params(params: int, zero_stage: int, data: int) -> int:
    """Parameters whose optimizer step one rank runs: its shard from ZeRO 1 on, else all it holds."""
    return params // (data if zero_stage >= 1 else 1)


def optimizer_step_segments(stepped_params: int, spec, precision: str) -> list[tuple]:
    """The fused optimizer step (segments.py) over ``stepped_params`` parameters (the rank's shard
    under ZeRO >= 1: memory.stepped_params)."""
    return to_segments(lc.optimizer_step_ops(stepped_params, precision), spec, precision)


def gathers_every_layer(zero_stage: int) -> bool:
    """ZeRO-3: each layer's weights are all-gathered before its forward and its backward."""
    return zero_stage >= 3


def gathers_after_step(zero_stage: int) -> bool:
    """ZeRO 1-2: the updated weights are all-gathered after the optimizer step (ZeRO-3 keeps its
    shard: the next gathers fetch it)."""
    return zero_stage in (1, 2)


def gradient_collective(zero_stage: int) -> str:
    """How a gradient bucket is reduced: each rank keeps its shard from ZeRO 1 on."""
    return "reduce_scatter" if zero_stage >= 1 else "all_reduce"


def bucket_bytes(bucket_size_mb: float) -> int:
    """A gradient bucket's capacity in bytes (``parallel.bucket_size_mb``, MiB)."""
    return int(bucket_size_mb * MiB)


def gradient_buckets(layers: int, grad_bytes_per_layer: int, bucket_bytes: int) -> tuple[dict[int, int], int]:
    """The buckets of one model chunk's backward: ``({layer: bytes launched after it}, rest)``.

    Layers are counted in backward order; a bucket goes as soon as the gradients accumulated since
    the last one reach ``bucket_bytes``; ``rest`` (possibly 0) goes at the end of the chunk.
    """
    launched: dict[int, int] = {}
    accumulated = 0
    for layer in range(layers):
        accumulated += grad_bytes_per_layer
        if accumulated >= bucket_bytes:
            launched[layer] = accumulated
            accumulated = 0
    return launched, accumulated


def zero3_gather_bytes(layer_params: int, precision: str) -> int:
    """A ZeRO-3 all-gather of one layer's weights: the gathered buffer (nccl-tests' size), i.e. the
    layer's 16-bit weights on this tensor rank; each member contributes 1/shard of it."""
    return layer_params * weight_bytes_per_param(precision)


def zero3_unit_buffers_bytes(layer_params: int, precision: str, grad_bytes: int) -> int:
    """What ZeRO-3 holds beyond its shards at any time: two gathered layers (the one running and the
    one prefetched) and one layer's unsharded gradients before their reduce-scatter."""
    return 2 * zero3_gather_bytes(layer_params, precision) + layer_params * grad_bytes


def zero3_copy_in_segments(unit_params: int, spec, precision: str, grad_bytes: int) -> list[tuple]:
    """FSDP2's copy-in before a unit's reduce-scatter (``chunk_cat``): one kernel reading the unit's
    unsharded gradients in the weights' dtype and writing them, in the reduce dtype, into the
    reduce-scatter's input buffer (configs/torch/fsdp_gpt.py's capture records it per unit)."""
    moved = unit_params * (weight_bytes_per_param(precision) + grad_bytes)
    return to_segments([lc.Op("zero3.reduce_scatter.copy_in", "elementwise", bytes_moved=float(moved))], spec,
                       precision)  # fmt: skip


def zero3_root_params(config, stage: int, extra_params: int) -> int:
    """FSDP2's root unit on a stage under ZeRO-3: the parameters outside the layers (the embedding,
    the output layer; ``extra_params``) and, on the last stage, the final norm, gathered once per
    microbatch and held through its forward and backward (FSDP2 does not reshard the root after
    forward), their gradients reduce-scattered after its backward. 0 without ZeRO-3 sharding."""
    if not gathers_every_layer(config.parallel.zero_stage) or shard_size(config) < 2:
        return 0
    m = config.model
    final_norm = (2 if m.add_bias_linear else 1) * m.hidden_size if stage == config.parallel.pipeline - 1 else 0
    return extra_params + final_norm if extra_params else 0


def param_gather_buckets(layers: int, layer_bytes: int, bucket_bytes: int,
                         extra_bytes: int = 0) -> list[tuple[int, int]]:  # fmt: skip
    """ZeRO 1-2's weight all-gathers overlapped with the forward: ``[(first layer, bytes)]`` in
    forward order; a bucket closes once it holds ``bucket_bytes``; ``extra_bytes`` (the embedding
    or output layer's weights) go with the first."""
    buckets: list[tuple[int, int]] = []
    start, accumulated = 0, extra_bytes
    for layer in range(layers):
        accumulated += layer_bytes
        if accumulated >= bucket_bytes or layer == layers - 1:
            buckets.append((start, accumulated))
            start, accumulated = layer + 1, 0
    if not buckets and accumulated:
        buckets.append((0, accumulated))
    return buckets


def weight_gather_bytes(params: int, precision: str) -> int:
    """ZeRO 1-2's all-gather of the updated weights after the optimizer step (the whole buffer)."""
    return params * weight_bytes_per_param(precision)


def data_parallel_tail_ns(layer_backward_ns: int, layers: int, chunk_backward_ns: int, chunks: int, stages: int,
                          grad_bytes_per_layer: int, bucket_bytes: int, bucket_ns,
                          shared_ports: bool = False) -> int:  # fmt: skip
    """Gradient reduction still running when a stage's last backward ends (exposed, in ns).

    The buckets of :func:`gradient_buckets` during each chunk's backward of the last microbatch: a
    bucket (``bucket_ns(size)``) is launched on the ``dp`` stream (one at a time) after the layer
    that fills it, the rest at the end of the chunk. Chunk ``c``'s last backward ends
    ``c * stages`` backward slots before the stage's last one (interleaved 1F1B drains chunk by
    chunk); the tail is what the ``dp`` stream has left when the last backward ends.

    ``shared_ports``: the data-parallel group sits inside the node of the tensor-parallel group, so
    both use the same scale-up ports, which the engine reserves for a whole closed-form collective:
    a bucket then holds back the backward's next tensor-parallel collective, and the backward
    stretches by the bucket instead of hiding it.
    """
    launched, rest = gradient_buckets(layers, grad_bytes_per_layer, bucket_bytes)
    end = chunks * stages * chunk_backward_ns  # a time origin before every chunk's last backward
    dp_free = 0
    for chunk in reversed(range(chunks)):
        start = end - chunk * stages * chunk_backward_ns - chunk_backward_ns
        t = start
        for layer in range(layers):
            t += layer_backward_ns
            size = launched.get(layer)
            if size is not None:
                dp_free = max(dp_free, t) + bucket_ns(size)
                if shared_ports:
                    t = dp_free
        if rest:
            dp_free = max(dp_free, start + chunk_backward_ns) + bucket_ns(rest)
    return max(0, dp_free - end)


def zero3_pass_ns(layer_ns: int, gather_ns: int, layers: int, shared_lead_ns: int | None = None,
                  tp_ns: int = 0) -> int:  # fmt: skip
    """Layers whose weights ZeRO-3 all-gathers one layer ahead (training.zero3_gathers): the first
    gather is exposed, then each layer takes the longer of its compute and the next gather.

    ``shared_lead_ns`` (None: the gathers use other links than the tensor-parallel collectives):
    the data-parallel group shares the tensor group's scale-up ports, which a closed-form collective
    holds for its whole duration. The next layer's gather starts with the layer, so the layer's
    first tensor-parallel collective, ``shared_lead_ns`` of compute in, waits for what is left of
    it; and the ports carry the gather and the layer's ``tp_ns`` of collectives one after the other.
    """
    if layers == 0:
        return 0
    if shared_lead_ns is None:
        period = max(layer_ns, gather_ns)
    else:
        period = max(layer_ns + max(0, gather_ns - shared_lead_ns), gather_ns + tp_ns)
    return gather_ns + (layers - 1) * period + layer_ns

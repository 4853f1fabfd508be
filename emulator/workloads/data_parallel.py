"""Data parallelism and ZeRO: what each rank of a data-parallel group holds, and what it sends.

    emulator run configs/runs/bloom-560m-zero2.yaml     # 32-way data parallel, ZeRO 2

The one description of the technique that the emulated program (training.py), the closed-form
estimate (emulator/studies/estimate.py), the memory model (memory.py) and the planner (emulator/studies/plan.py)
share. Mixed-precision Adam as in Megatron-LM and ZeRO (Rajbhandari et al. 2020): 16-bit weights
(2 B per parameter), fp32 main gradients (4 B; 2 B for fp16), fp32 master weights with Adam's m and
v (12 B). ZeRO stage 1 partitions the optimizer states over the ``d`` ranks of the group, stage 2
the gradients too, stage 3 the weights too.

Traffic: during the last microbatch's backward the gradients are reduced in buckets of
``parallel.bucket_size_mb`` as layers fill them (all-reduce; reduce-scatter with ZeRO >= 1, each
rank keeping its shard); after the optimizer step ZeRO 1-2 all-gather the updated 16-bit weights,
and ZeRO-3 all-gathers every layer's weights before its forward and its backward, one layer ahead.
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


def grad_bytes_per_param(precision: str) -> int:
    """Gradients: fp32 main gradients (Megatron accumulates in fp32), 16-bit under fp16."""
    return 2 if precision == "fp16" else 4


def optimizer_bytes_per_param(precision: str) -> int:
    """Adam's states: fp32 master weights, m and v (12 B); no master copy in fp32 training (8 B)."""
    return 8 if precision == "fp32" else 12


def model_state_bytes(params: int, precision: str, zero_stage: int, data: int) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes on one rank holding ``params`` parameters before
    partitioning, in a data-parallel group of ``data`` ranks at ``zero_stage``."""
    weights = params * weight_bytes_per_param(precision) // (data if zero_stage >= 3 else 1)
    grads = params * grad_bytes_per_param(precision) // (data if zero_stage >= 2 else 1)
    optimizer = params * optimizer_bytes_per_param(precision) // (data if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def optimizer_params(params: int, zero_stage: int, data: int) -> int:
    """Parameters whose optimizer step one rank runs: its shard from ZeRO 1 on, else all it holds."""
    return params // (data if zero_stage >= 1 else 1)


def optimizer_step_segments(params: int, zero_stage: int, data: int, spec, precision: str) -> list[tuple]:
    """The fused optimizer step (segments.py) of a rank holding ``params`` parameters."""
    return to_segments(lc.optimizer_step_ops(optimizer_params(params, zero_stage, data), precision), spec, precision)


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


def zero3_gather_bytes(layer_params: int, precision: str, data: int) -> int:
    """A ZeRO-3 all-gather of one layer's weights (the whole buffer, every rank's shard)."""
    return layer_params * weight_bytes_per_param(precision) * data


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

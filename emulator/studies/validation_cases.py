"""Published measurements the emulator is validated against (copied with their sources, so the
package never reads anything outside itself at run time)."""

from __future__ import annotations

KORTHIKANTI = (
    "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models (arXiv:2205.05198)"
)

# Table 5: iteration time in seconds; Selene, DGX A100 80GB, 8x HDR per node, data parallel 1,
# seq 2048, vocab 51200; 175B and 530B use the interleaved schedule with 3 model chunks.
TABLE5 = [
    # name, model preset, tp, pp, gpus, global batch, micro batch, chunks, full, selective+SP, MFU sel+SP
    ("22B", "megatron-22b", 8, 1, 8, 4, 4, 1, 1.42, 1.10, 0.415),
    ("175B", "megatron-175b", 8, 8, 64, 64, 1, 3, 18.13, 13.75, 0.514),
    ("530B", "megatron-530b", 8, 35, 280, 280, 1, 3, 49.05, 37.83, 0.560),
    ("1T", "megatron-1t", 8, 64, 512, 512, 1, 1, 94.42, 71.49, 0.563),
]

# Table 4: one 22B layer (TP 8, micro batch 4), forward and backward in milliseconds.
TABLE4_22B_MS = {
    # (recompute, sequence_parallel): (forward, backward)
    ("none", False): (7.7, 11.9),
    ("none", True): (7.2, 11.8),
    ("full", False): (7.7, 19.5),
    ("selective", False): (7.7, 13.2),
    ("selective", True): (7.2, 13.1),
}
TABLE4_NAMES = {
    ("none", False): "baseline no recompute",
    ("none", True): "sequence parallel",
    ("full", False): "full recompute",
    ("selective", False): "selective recompute",
    ("selective", True): "selective + sequence parallel",
}

# nccl-tests all_reduce bus bandwidth at large sizes (GB/s)
NCCL_BUSBW = [
    # name, cluster preset, gpus, busbw, source
    ("8x A100 NVSwitch", "dgx-a100-hdr", 8, 230.0, "NVIDIA/nccl-tests issue 149 (maintainer)"),
    ("DGX A100 2 nodes, 8x HDR", "dgx-a100-hdr", 16, 192.0, "NVIDIA/nccl issue 812 (maintainer)"),
    ("8x H100 NVSwitch (ring)", "dgx-h100-ndr", 8, 370.0, "NVIDIA/nccl-tests issue 212 (maintainer)"),
]

RAJBHANDARI = (
    "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter Models (arXiv:1910.02054)"
)

# Figure 1: model-state memory per GPU (weights, gradients, Adam states in mixed precision: 2 + 2 + 12
# bytes per parameter) of a 7.5B-parameter model on 64 data-parallel GPUs, in GB (10^9 bytes).
ZERO_FIGURE1 = {"parameters": 7.5e9, "data_parallel": 64, "gb_by_stage": {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.88}}

# Table 2: activation bytes one transformer layer keeps per tensor rank and microbatch (16-bit
# activations; s sequence, b micro-batch, h hidden, a heads, t tensor parallel). The formula texts
# are reference/published.yaml's `formulas.activation_memory_per_layer_bytes`, verbatim, and are
# evaluated as written (tests/emulator/test_validate.py checks they still match the reference).
ACTIVATION_PER_LAYER = {
    "no_parallelism": "s*b*h*(34 + 5*a*s/h)",
    "tensor_parallel": "s*b*h*(10 + 24/t + 5*a*s/(h*t))",
    "tensor_and_sequence_parallel": "s*b*h*(34/t + 5*a*s/(h*t))",
    "tensor_parallel_selective_recompute": "s*b*h*(10 + 24/t)",
    "tensor_and_sequence_parallel_selective_recompute": "s*b*h*(34/t)",
    "full_recompute": "s*b*h*2",
}

# The Table 2 row of each (recompute, sequence parallel) the activation-memory cases run, and their
# labels. The cases are Table 5's two published configurations of each model, plus the 22B model
# with selective recompute alone (Table 4's setup); the variants without recomputation need more
# than the A100's 80 GiB at these sizes, so the emulator stops them as out of memory.
ACTIVATION_CASES = {
    ("full", False): ("full_recompute", "full recompute"),
    ("selective", True): ("tensor_and_sequence_parallel_selective_recompute", "selective + SP"),
    ("selective", False): ("tensor_parallel_selective_recompute", "selective recompute"),
}

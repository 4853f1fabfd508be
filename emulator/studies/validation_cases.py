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

MEGATRON_README = (
    "NVIDIA/Megatron-LM README.md, Training Speed and Scalability (commit f2e5db40, 2024-07-15, Megatron-Core r0.8.0)"
)

# Weak scaling on H100 (DGX H100 assumed: 8 GPUs a node, 8x NDR): per-GPU model TFLOP/s, end to
# end; vocabulary 131072, sequence 4096, data parallel 48, --overlap-grad-reduce
# --overlap-param-gather --tp-comm-overlap (hence sequence parallelism and the distributed
# optimizer). Assumed (not in the source, reported in each row): no recomputation, fused attention,
# GeLU MLP of 4h, untied embeddings with rotary positions (which make the sizes' names come out:
# 16B = 32 x 12h^2 + 2Vh), and the micro-batching a Megatron user picks when memory allows:
# without a pipeline (PP 1), a replica's 4 sequences as one micro-batch (no gradient accumulation,
# so the gradient reduce-scatter overlaps the whole backward); with one, micro batch 1 and one layer
# per model chunk (as NVIDIA's GPT-3 175B and Nemotron-4 340B recipes, 96 layers over PP 8 x 12
# virtual stages, and Llama 3 405B's 8 chunks of a 16-stage pipeline).
MEGATRON_H100 = [
    # size, layers, hidden, heads, tp, pp, gpus, global batch, TFLOP/s per GPU
    ("1.7B", 24, 2048, 16, 1, 1, 48, 192, 408.8),
    ("7.1B", 30, 4096, 32, 2, 1, 96, 192, 465.9),
    ("16B", 32, 6144, 48, 4, 1, 192, 192, 489.1),
    ("32B", 48, 7168, 56, 8, 1, 384, 192, 459.6),
    ("70B", 84, 8192, 64, 8, 2, 768, 384, 419.7),
    ("119B", 92, 10240, 80, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 96, 16384, 128, 8, 8, 3072, 1536, 474.4),
    ("462B", 112, 18432, 144, 8, 16, 6144, 3072, 459.9),
]
MEGATRON_VOCAB, MEGATRON_SEQ = 131072, 4096

LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models (arXiv:2407.21783), section 3.3 and Table 4"

# Llama 3 405B (configs/models/llama3-405b.yaml) on Meta's cluster (configs/clusters/meta-h100-roce.yaml):
# ranks ordered TP, CP, PP, DP; interleaved 1F1B with 8 model chunks a stage, the first and last
# stage one layer fewer (the embedding and the loss each in a layer's slot); gradients and optimizer
# states sharded (ZeRO-2 like); no recomputation at 8K; context parallelism by all-gather of K/V;
# 16M tokens a batch. Assumed (reported in each row): micro batch 1, fused attention, fp32 gradient
# reduction, TP communication overlap, no recomputation at 128K either, and the FLOPs a causal
# model needs (the attention's unmasked half; Megatron's count of the whole square would add 4% to
# the 8K rows' FLOPs and 40% to the 128K row's), as the source does not give its convention.
LLAMA3_405B = [
    # gpus, tp, cp, pp, dp, sequence, TFLOP/s per GPU
    (8192, 8, 1, 16, 64, 8192, 430),
    (16384, 8, 1, 16, 128, 8192, 400),
    (16384, 8, 16, 16, 8, 131072, 380),
]
LLAMA3_TOKENS_PER_BATCH = 16 * 2**20  # "16M": 2048 sequences of 8K, 128 of 128K
LLAMA3_CHUNKS = 8

TORCHTITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (2024-12)"

# Llama 3.1 8B (configs/models/llama3-8b.yaml) under FSDP2 full sharding on the 96 GB H100 (500 W,
# HBM2e 2.4 TB/s), sequence 8192, local batch 2, selective activation checkpointing (torchtitan's
# llama3_8b.toml: selective_ac_option "op", the per-op policy: training.recompute op_selective), bf16
# with fp32 gradient reduction (torchtitan's default, assumed); tokens per second per GPU, eager
# mode (training.kernels eager).
TORCHTITAN_8B = [
    # gpus, global batch, tokens/s per GPU, memory GiB
    (8, 16, 5762, 82.4),
    (128, 256, 5605, 67.0),
]

NEOX = "Black et al. 2022, GPT-NeoX-20B (arXiv:2204.06745) section 3; EleutherAI/gpt-neox configs/20B.yml"

# 12 HGX nodes of 8 A100-SXM4-40GB, 4 HDR NICs each (200 Gb/s assumed); TP 2, PP 4, DP 12, ZeRO 1,
# micro batch 4, global batch 1536, sequence 2048, full recomputation, fp16; 117 TFLOP/s per GPU.
# The source does not say whether recomputation is counted: counted (Megatron's formula of the
# time, Narayanan et al. 2021 eq. 3), a step is 47.8 s, which is the figure compared; not counted, 35.9 s.
NEOX_20B = {"tflops_per_gpu": 117, "step_s_recompute_counted": 47.8, "step_s_not_counted": 35.9}

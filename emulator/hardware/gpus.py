"""Catalogue of GPU types: peak throughput, HBM, and the efficiency-curve parameters.

    python -c "from emulator.hardware.gpus import get_gpu; print(get_gpu('a100-sxm-80gb'))"

Every figure names its source. Peak, HBM capacity and bandwidth come from vendor datasheets as
copied into ``reference/published.yaml`` (``gpus``); the maximum achievable GEMM efficiency comes
from the ``max_achievable_matmul_bf16`` rows of the same file. The two remaining parameters (how
large an operation must be to approach that efficiency, and the fraction of HBM bandwidth that
memory-bound kernels reach) are hardware-level constants calibrated once, on A100, against
Korthikanti et al. 2022 Table 4; see ``_MATMUL_HALF_TIME_S`` and ``_MEMORY_EFFICIENCY``. They are
never adjusted per model.

Conventions:

- ``peak_flops_per_s`` is *dense* tensor-core throughput (no 2:4 sparsity) per precision.
  ``'fp32'`` is the rate used for fp32 training math, i.e. the TF32 tensor-core rate where the GPU
  has TF32 (NVIDIA, MI300X) and the FP32 matrix-core rate otherwise (MI250X).
- HBM capacities are binary: an "80 GB" part exposes 80 GiB (nvidia-smi shows 81920 MiB).
- ``mi250x`` is the whole 2-GCD package, as the datasheet and published.yaml quote it. Software
  sees each GCD as a separate device, so a cluster whose ranks are GCDs (Frontier runs 8 ranks
  on 4 MI250X) should use ``mi250x-gcd``: one GCD, half of every package figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from emulator.errors import ConfigError

# Half-saturation of the GEMM efficiency curve, expressed as a time: eff(F) = eff_max * F/(F+F_half)
# with F_half = peak_bf16 * eff_max * _MATMUL_HALF_TIME_S. That curve is exactly a GEMM running at
# eff_max plus a fixed _MATMUL_HALF_TIME_S per kernel (launch, ramp-up, last partial wave), which
# is why a time, not a FLOP count, is the portable hardware constant. 10 us is a plausible tail for
# a cuBLAS GEMM and keeps the largest published GEMM of every catalogue GPU within 2% of its
# measured max achievable efficiency. Calibration (Korthikanti et al. 2022 Table 4, 22B layer on
# A100, the ten forward/backward times of its five rows): the fit is flat in this parameter (rms
# error 4.5-4.7% for anything from 0 to 80 us once the memory efficiency is refitted), so the
# value is set by the kernel-tail argument rather than by the fit.
_MATMUL_HALF_TIME_S = 10e-6

# Fraction of datasheet HBM bandwidth reached by large memory-bound kernels (layernorm, softmax,
# dropout, bias+activation, optimizer), and its half-saturation as a time (per-kernel launch and
# ramp cost, 5 us: typical of PyTorch eager kernels). STREAM-like copies reach 0.85-0.9 of
# datasheet bandwidth on A100/H100, but the PyTorch/Apex kernels of Megatron-LM 2022 (unfused
# dropout writing a byte mask, masked softmax, two-kernel layernorm backward) stay well below.
# 0.64 is the least-squares fit (0.635, rounded) to the Korthikanti Table 4 layer times with the
# byte counts of emulator/workloads/layer_costs.py and 10 us / 5 us half times; it is used for
# every GPU for want of comparable published measurements on the others.
_MEMORY_EFFICIENCY = 0.64

# Inside a training loop kernels run slower than in isolation: sustained power/clock limits under
# whole-GPU load, NCCL kernels sharing SMs and HBM with overlapped compute, launch gaps between the
# hundreds of kernels of a layer. Calibrated once, on A100, so that the emulator's full iterations
# match Korthikanti et al. 2022 (Table 5: 22B and 175B rows, Table 4: 22B layer times) with the
# engine's own overlap of tensor-parallel communication; the 530B and 1T rows are then predictions
# (see ``emulator validate``). Used for every GPU type for want of comparable published runs.
_SUSTAINED_FRACTION = 0.87
_MEMORY_HALF_TIME_S = 5e-6

# The same figure for the GH100 GPUs (H100, H200), calibrated once against the Megatron-LM README's
# H100 weak-scaling table (published.yaml megatron_lm_readme_h100: nine models from 1.7B to 462B on
# 48 to 6144 GPUs, per-GPU model TFLOP/s): the value with the least mean absolute error over its
# rows as `emulator validate --only Megatron` runs them (0.66, 0.68, 0.70 tried: 3.8%, 3.7%, 5.5%). A
# 700 W H100 sustains a smaller share of its boost-clock datasheet peak under whole-GPU load than
# the A100 does, and the rows' kernels are 2024's (fused attention, TP overlap), so the A100 value
# does not carry over. The Llama 3 405B and torchtitan rows of `emulator validate` are predictions.
_H100_SUSTAINED_FRACTION = 0.68

# Batched attention GEMMs (QK^T and PV, inner dimension = head size) are typically memory-bound
# at training sequence lengths; when compute-bound they reach about the same tensor-core fraction
# as large GEMMs, so the same cap is used (ratio 1.0). Kept separate so a flash-attention kernel
# model can change it in one place.
_ATTENTION_EFFICIENCY_RATIO = 1.0


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type: peak rates, memory, and the efficiency-curve parameters of its roofline."""

    name: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    vector_flops_per_s: float  # non-tensor fp32 (CUDA/vector cores): compute term of elementwise ops
    hbm_bytes: int
    hbm_bandwidth_bytes_per_s: float
    matmul_efficiency_max: float  # published max achievable bf16 GEMM fraction of peak
    matmul_half_flops: float  # GEMM size (FLOPs) at which efficiency is half of the max
    attention_efficiency_max: float
    memory_efficiency_max: float  # fraction of HBM bandwidth reached by large memory-bound ops
    memory_half_bytes: float  # op size (bytes) at which memory efficiency is half of the max
    source: str
    # fraction of isolated-kernel speed sustained inside a real training loop (see _SUSTAINED_FRACTION)
    sustained_fraction: float = 1.0

    def __post_init__(self) -> None:
        # A read-only view keeps the spec immutable even though the mapping is a dict.
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(dict(self.peak_flops_per_s)))


def make_gpu(
    name: str,
    peak_tflops: Mapping[str, float],
    vector_tflops: float,
    hbm_gib: float,
    hbm_tbps: float,
    matmul_efficiency_max: float,
    source: str,
    sustained_fraction: float = _SUSTAINED_FRACTION,
) -> GpuSpec:
    """Build a GpuSpec from datasheet units, deriving the curve sizes from the calibrated times."""
    peak = {k: v * 1e12 for k, v in peak_tflops.items()}
    bandwidth = hbm_tbps * 1e12
    # F_half is sized on the bf16 rate (the calibrated one); at fp8/fp32 the same FLOP count means
    # a shorter/longer fixed cost, a second-order effect no published figure pins down.
    reference_peak = peak.get("bf16", max(peak.values()))
    return GpuSpec(
        name=name,
        peak_flops_per_s=peak,
        vector_flops_per_s=vector_tflops * 1e12,
        hbm_bytes=int(hbm_gib * 2**30),
        hbm_bandwidth_bytes_per_s=bandwidth,
        matmul_efficiency_max=matmul_efficiency_max,
        matmul_half_flops=reference_peak * matmul_efficiency_max * _MATMUL_HALF_TIME_S,
        attention_efficiency_max=matmul_efficiency_max * _ATTENTION_EFFICIENCY_RATIO,
        memory_efficiency_max=_MEMORY_EFFICIENCY,
        memory_half_bytes=bandwidth * _MEMORY_EFFICIENCY * _MEMORY_HALF_TIME_S,
        source=source,
        sustained_fraction=sustained_fraction,
    )


_EFF_SOURCE = "max achievable GEMM: stas00/ml-engineering via published.yaml max_achievable_matmul_bf16"

GPU_TYPES: dict[str, GpuSpec] = {}


def register_gpu(spec: GpuSpec, *, replace: bool = False) -> GpuSpec:
    """Add a GPU type to the catalogue; ConfigError if the name exists and replace is False."""
    if spec.name in GPU_TYPES and not replace:
        raise ConfigError(f"GPU type '{spec.name}' is already registered; pass replace=True to override it")
    GPU_TYPES[spec.name] = spec
    return spec


def get_gpu(name: str) -> GpuSpec:
    """The catalogue entry for ``name``; ConfigError naming the known types if there is none."""
    try:
        return GPU_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(GPU_TYPES))
        raise ConfigError(f"unknown GPU type '{name}'; known: {known}") from None


for _spec in (
    make_gpu(
        "a100-sxm-80gb",
        {"bf16": 312, "fp16": 312, "fp32": 156},
        vector_tflops=19.5,
        hbm_gib=80,
        hbm_tbps=2.039,
        matmul_efficiency_max=0.859,
        source="NVIDIA A100 datasheet (bf16/fp16 312, TF32 156, FP32 19.5 TFLOP/s, 80 GB HBM2e, "
        f"2.039 TB/s); published.yaml gpus.a100-sxm-80gb; {_EFF_SOURCE} (a100-sxm 0.859)",
    ),
    # The 40 GB SXM4 part (HGX A100 40GB): same peak rates and GEMM efficiency, HBM2 at 1.555 TB/s.
    make_gpu(
        "a100-sxm-40gb",
        {"bf16": 312, "fp16": 312, "fp32": 156},
        vector_tflops=19.5,
        hbm_gib=40,
        hbm_tbps=1.555,
        matmul_efficiency_max=0.859,
        source="NVIDIA A100 datasheet (SXM4 40 GB HBM2, 1.555 TB/s; bf16/fp16 312 TFLOP/s); "
        f"{_EFF_SOURCE} (a100-sxm 0.859); GPT-NeoX-20B's cluster (published.yaml gpt_neox_20b)",
    ),
    # Same GA100 silicon and peak rates as SXM; PCIe boards are capped at 250-300 W and may clock
    # lower under sustained GEMMs, which no published row quantifies, so the SXM GEMM efficiency
    # is reused (an optimistic assumption for commodity PCIe clusters).
    make_gpu(
        "a100-pcie-40gb",
        {"bf16": 312, "fp16": 312, "fp32": 156},
        vector_tflops=19.5,
        hbm_gib=40,
        hbm_tbps=1.555,
        matmul_efficiency_max=0.859,
        source="NVIDIA A100 PCIe datasheet (40 GB HBM2, 1.555 TB/s); efficiency assumed = a100-sxm 0.859",
    ),
    make_gpu(
        "a100-pcie-80gb",
        {"bf16": 312, "fp16": 312, "fp32": 156},
        vector_tflops=19.5,
        hbm_gib=80,
        hbm_tbps=1.935,
        matmul_efficiency_max=0.859,
        source="NVIDIA A100 PCIe datasheet (80 GB HBM2e, 1.935 TB/s); efficiency assumed = a100-sxm 0.859",
    ),
    make_gpu(
        "h100-sxm-80gb",
        {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7, "fp8": 1978.9},
        vector_tflops=66.9,
        hbm_gib=80,
        hbm_tbps=3.35,
        matmul_efficiency_max=0.801,
        source="NVIDIA H100 SXM datasheet (dense: bf16 989.4, TF32 494.7, fp8 1978.9, FP32 66.9 TFLOP/s, "
        f"80 GB HBM3, 3.35 TB/s); published.yaml gpus.h100-sxm-80gb; {_EFF_SOURCE} (h100-sxm 0.801)",
        sustained_fraction=_H100_SUSTAINED_FRACTION,
    ),
    # The 96 GB HBM2e H100 of torchtitan's published runs (published.yaml torchtitan_llama31_8b_fsdp:
    # 96 GB, 2.4 TB/s, 500 W power limit): the same GH100 peak and GEMM efficiency are assumed; its
    # power cap lowers sustained clocks by an amount no published figure gives (torchtitan's benchmark
    # note: its peak lies between the SXM and NVL parts' and is not known), so no derating is applied.
    make_gpu(
        "h100-sxm-96gb",
        {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7, "fp8": 1978.9},
        vector_tflops=66.9,
        hbm_gib=96,
        hbm_tbps=2.4,
        matmul_efficiency_max=0.801,
        source="published.yaml torchtitan_llama31_8b_fsdp hardware (96 GB HBM2e, 2.4 TB/s); peak and "
        f"efficiency assumed = h100-sxm-80gb; {_EFF_SOURCE} (h100-sxm 0.801)",
        sustained_fraction=_H100_SUSTAINED_FRACTION,
    ),
    # Same GH100 die and clocks as the H100 SXM with more and faster HBM3e; the H100 GEMM
    # efficiency is reused (no published H200 row).
    make_gpu(
        "h200-sxm-141gb",
        {"bf16": 989, "fp16": 989, "fp32": 494.7, "fp8": 1979},
        vector_tflops=66.9,
        hbm_gib=141,
        hbm_tbps=4.8,
        matmul_efficiency_max=0.801,
        source="NVIDIA H200 datasheet (bf16 989, fp8 1979 dense, 141 GB HBM3e, 4.8 TB/s); "
        "published.yaml gpus.h200-sxm-141gb; efficiency assumed = h100-sxm 0.801",
        sustained_fraction=_H100_SUSTAINED_FRACTION,
    ),
    # MI250X has no TF32: 'fp32' is the FP32 matrix-core rate. Efficiency is the per-GCD row.
    make_gpu(
        "mi250x",
        {"bf16": 383, "fp16": 383, "fp32": 95.7},
        vector_tflops=47.9,
        hbm_gib=128,
        hbm_tbps=3.2768,
        matmul_efficiency_max=0.767,
        source="AMD Instinct MI250X datasheet, whole 2-GCD package (bf16/fp16 383, FP32 matrix 95.7, "
        f"FP32 vector 47.9 TFLOP/s, 128 GB HBM2e, 3.28 TB/s); published.yaml gpus.mi250x; {_EFF_SOURCE} "
        "(mi250x-1gcd 0.767)",
    ),
    make_gpu(
        "mi250x-gcd",
        {"bf16": 191.5, "fp16": 191.5, "fp32": 47.85},
        vector_tflops=23.95,
        hbm_gib=64,
        hbm_tbps=1.6384,
        matmul_efficiency_max=0.767,
        source="one GCD of the AMD MI250X (half of the package figures; 191.5 TFLOP/s bf16 as in "
        f"published.yaml max_achievable_matmul_bf16 mi250x-1gcd); {_EFF_SOURCE} (0.767)",
    ),
    # AMD quotes 1307.4 TFLOP/s bf16/fp16; published.yaml rounds to 1300, which is used here.
    make_gpu(
        "mi300x",
        {"bf16": 1300, "fp16": 1300, "fp32": 653.7, "fp8": 2614.9},
        vector_tflops=163.4,
        hbm_gib=192,
        hbm_tbps=5.3,
        matmul_efficiency_max=0.601,
        source="AMD Instinct MI300X datasheet (bf16 1300 per published.yaml, TF32 653.7, fp8 2614.9, "
        f"FP32 vector 163.4 TFLOP/s, 192 GB HBM3, 5.3 TB/s); published.yaml gpus.mi300x; {_EFF_SOURCE} "
        "(mi300x 0.601)",
    ),
):
    register_gpu(_spec)

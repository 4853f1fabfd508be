"""Roofline duration of one compute operation on one GPU.

    python -c "from emulator.hardware.compute import op_duration_ns; \
from emulator.hardware.gpus import get_gpu; print(op_duration_ns(get_gpu('a100-sxm-80gb'), 2*8192**3, 3*2*8192**2))"

``duration = max(flops / (peak * eff_flops(flops)), bytes / (hbm_bw * eff_mem(bytes)))`` with the
saturating efficiency curves ``eff(x) = eff_max * x / (x + x_half)`` whose parameters live in the
GPU's catalogue entry (emulator/hardware/gpus.py). Substituting the curve gives the closed form
used below, ``(x + x_half) / (rate * eff_max)``: an operation runs at the maximum achievable rate
plus a fixed per-kernel cost, which is both cheap to evaluate and easy to reason about.
"""

from __future__ import annotations

from emulator.errors import ConfigError
from emulator.hardware.gpus import GpuSpec

KINDS = ("matmul", "attention", "elementwise")


def eff_flops(gpu: GpuSpec, kind: str, flops: float) -> float:
    """Fraction of peak FLOP/s reached by an operation of ``flops`` FLOPs of this kind."""
    if kind == "matmul":
        eff_max = gpu.matmul_efficiency_max
    elif kind == "attention":
        eff_max = gpu.attention_efficiency_max
    elif kind == "elementwise":
        # Elementwise work runs on vector cores at their peak; it is almost always memory-bound.
        return 1.0
    else:
        raise ConfigError(f"unknown compute op kind '{kind}'; known: {', '.join(KINDS)}")
    if flops <= 0:
        return 0.0
    return eff_max * flops / (flops + gpu.matmul_half_flops)


def eff_mem(gpu: GpuSpec, bytes_moved: float) -> float:
    """Fraction of HBM bandwidth reached by an operation moving ``bytes_moved`` bytes."""
    if bytes_moved <= 0:
        return 0.0
    return gpu.memory_efficiency_max * bytes_moved / (bytes_moved + gpu.memory_half_bytes)


# (id(gpu), kind, precision) -> (1 / compute rate, half FLOPs, 1 / memory rate, half bytes, gpu).
# Durations are computed for every compute op of every rank, so the per-kind constants are derived
# once; the spec is kept in the value so a recycled id() can never alias another GPU.
_RATES: dict[tuple[int, str, str], tuple[float, float, float, float, GpuSpec]] = {}


def _rates(gpu: GpuSpec, kind: str, precision: str) -> tuple[float, float, float, float, GpuSpec]:
    if kind == "matmul":
        eff_max, half_flops = gpu.matmul_efficiency_max, gpu.matmul_half_flops
    elif kind == "attention":
        eff_max, half_flops = gpu.attention_efficiency_max, gpu.matmul_half_flops
    elif kind == "elementwise":
        # Elementwise FLOPs run on vector cores at their peak; the memory term almost always wins.
        eff_max, half_flops = 1.0, 0.0
    else:
        raise ConfigError(f"unknown compute op kind '{kind}'; known: {', '.join(KINDS)}")
    peak = gpu.peak_flops_per_s.get(precision)
    if peak is None:
        known = ", ".join(sorted(gpu.peak_flops_per_s))
        raise ConfigError(f"precision '{precision}' is not supported by GPU type '{gpu.name}'; known: {known}")
    if kind == "elementwise":
        peak = gpu.vector_flops_per_s
    mem_rate = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency_max
    sustained = gpu.sustained_fraction
    entry = (1.0 / (peak * eff_max * sustained), half_flops, 1.0 / (mem_rate * sustained), gpu.memory_half_bytes, gpu)
    _RATES[(id(gpu), kind, precision)] = entry
    return entry


def op_duration_ns(
    gpu: GpuSpec,
    flops: float,
    bytes_moved: float,
    kind: str = "matmul",
    precision: str = "bf16",
) -> int:
    """Roofline duration in integer nanoseconds (rounded up; 0 only for an op with no work).

    ``kind`` is 'matmul' (tensor-core GEMM), 'attention' (batched score/context GEMMs) or
    'elementwise' (memory-bound kernels, whose FLOPs run on vector cores). Raises ConfigError for
    an unknown kind or a precision the GPU has no tensor-core rate for.
    """
    rates = _RATES.get((id(gpu), kind, precision))
    if rates is None or rates[4] is not gpu:
        rates = _rates(gpu, kind, precision)
    inv_flop_rate, half_flops, inv_byte_rate, half_bytes, _ = rates
    # flops / (peak * eff_max * F/(F+F_half)) == (F + F_half) / (peak * eff_max): no division by F.
    seconds = (flops + half_flops) * inv_flop_rate if flops > 0 else 0.0
    if bytes_moved > 0:
        mem_seconds = (bytes_moved + half_bytes) * inv_byte_rate
        if mem_seconds > seconds:
            seconds = mem_seconds
    if seconds <= 0.0:
        return 0
    ns = seconds * 1e9
    whole = int(ns)
    return whole + 1 if ns > whole else max(whole, 1)

"""Roofline compute model: closed forms, efficiency curves, errors."""

import dataclasses

import pytest

from emulator.errors import ConfigError
from emulator.hardware.compute import eff_flops, eff_mem, op_duration_ns
from emulator.hardware.gpus import GPU_TYPES, get_gpu

def isolated(name: str):
    """The catalogue entry as an isolated kernel sees it (no sustained-in-training factor)."""
    return dataclasses.replace(get_gpu(name), sustained_fraction=1.0)


A100 = isolated("a100-sxm-80gb")

# published.yaml max_achievable_matmul_bf16: GPU -> (m, n, k, published efficiency).
LARGEST_GEMMS = {
    "a100-sxm-80gb": (6912, 16384, 2048, 0.859),
    "h100-sxm-80gb": (6144, 17920, 2816, 0.801),
    "mi250x-gcd": (1024, 14080, 19968, 0.767),
    "mi300x": (4096, 10240, 4864, 0.601),
}


def test_compute_bound_closed_form():
    """A GEMM with negligible bytes takes (F + F_half) / (peak * eff_max)."""
    flops = 1e13
    expected_s = (flops + A100.matmul_half_flops) / (312e12 * 0.859)
    assert op_duration_ns(A100, flops, 1.0) == pytest.approx(expected_s * 1e9, abs=1)


def test_memory_bound_closed_form():
    """A memory-bound op takes (B + B_half) / (hbm_bw * eff_mem_max)."""
    nbytes = 1e9
    expected_s = (nbytes + A100.memory_half_bytes) / (2.039e12 * A100.memory_efficiency_max)
    assert op_duration_ns(A100, 0.0, nbytes, kind="elementwise") == pytest.approx(expected_s * 1e9, abs=1)
    # The same bytes behind a tiny GEMM: the memory term dominates the roofline.
    assert op_duration_ns(A100, 1e6, nbytes) == op_duration_ns(A100, 0.0, nbytes, kind="elementwise")


def test_large_ops_approach_the_asymptotic_rates():
    """Far above the half-saturation sizes, achieved rates equal peak * eff_max and bw * eff_mem_max."""
    flops, nbytes = 1e16, 1e13
    assert flops / (op_duration_ns(A100, flops, 0) * 1e-9) == pytest.approx(312e12 * 0.859, rel=1e-3)
    achieved_bw = nbytes / (op_duration_ns(A100, 0, nbytes, kind="elementwise") * 1e-9)
    assert achieved_bw == pytest.approx(2.039e12 * A100.memory_efficiency_max, rel=1e-3)


def test_no_work_and_tiny_work():
    """No work takes 0 ns; any nonzero work at least 1 ns, as an int, rounded up."""
    assert op_duration_ns(A100, 0, 0) == 0
    assert op_duration_ns(A100, 1.0, 0) >= 1
    assert op_duration_ns(A100, 0, 1.0, kind="elementwise") >= 1
    assert isinstance(op_duration_ns(A100, 1e12, 1e9), int)


@pytest.mark.parametrize("name", sorted(GPU_TYPES))
def test_efficiency_curves_monotone_and_bounded(name):
    """Efficiency rises with op size and never exceeds its cap."""
    gpu = GPU_TYPES[name]
    sizes = [10.0**p for p in range(3, 16)]
    for kind, cap in (("matmul", gpu.matmul_efficiency_max), ("attention", gpu.attention_efficiency_max)):
        effs = [eff_flops(gpu, kind, x) for x in sizes]
        assert sorted(set(effs)) == effs  # strictly increasing
        assert all(0 < e <= cap for e in effs)
    mems = [eff_mem(gpu, x) for x in sizes]
    assert sorted(set(mems)) == mems
    assert all(0 < e <= gpu.memory_efficiency_max for e in mems)
    # Durations grow with work.
    durations = [op_duration_ns(gpu, x, x / 100) for x in sizes]
    assert durations == sorted(durations)


@pytest.mark.parametrize("name", sorted(LARGEST_GEMMS))
def test_largest_gemms_reach_published_efficiency(name):
    """The published max-achievable GEMM shape runs within 3% of its published efficiency."""
    m, n, k, published = LARGEST_GEMMS[name]
    gpu = isolated(name)
    flops = 2.0 * m * n * k
    duration_s = op_duration_ns(gpu, flops, 2.0 * (m * k + k * n + m * n)) * 1e-9
    achieved = flops / duration_s / gpu.peak_flops_per_s["bf16"]
    assert published * 0.97 <= achieved <= published


def test_precision_selects_the_peak():
    """fp8 is faster than bf16 on H100, fp32 (TF32) slower."""
    h100 = isolated("h100-sxm-80gb")
    flops = 1e14
    bf16 = op_duration_ns(h100, flops, 0, precision="bf16")
    assert op_duration_ns(h100, flops, 0, precision="fp8") < bf16 < op_duration_ns(h100, flops, 0, precision="fp32")


def test_unknown_precision_and_kind_are_config_errors():
    """A precision the GPU lacks, or an unknown kind, raises ConfigError listing the known ones."""
    with pytest.raises(ConfigError, match=r"'fp8'.*a100-sxm-80gb.*bf16, fp16, fp32"):
        op_duration_ns(A100, 1e9, 1e6, precision="fp8")
    with pytest.raises(ConfigError, match=r"'conv'.*matmul, attention, elementwise"):
        op_duration_ns(A100, 1e9, 1e6, kind="conv")


def test_sustained_fraction_slows_every_kind_alike():
    """Inside training every kernel runs at sustained_fraction of its isolated speed."""
    gpu = get_gpu("a100-sxm-80gb")
    for kind, flops, nbytes in (("matmul", 1e12, 1e8), ("elementwise", 0.0, 1e9)):
        ratio = op_duration_ns(gpu, flops, nbytes, kind) / op_duration_ns(A100, flops, nbytes, kind)
        assert ratio == pytest.approx(1 / gpu.sustained_fraction, rel=1e-5)

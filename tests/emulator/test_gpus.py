"""GPU catalogue: figures copied from reference/published.yaml, registry behaviour."""

import pytest

from emulator.errors import ConfigError
from emulator.hardware.gpus import GPU_TYPES, get_gpu, make_gpu, register_gpu

# published.yaml `gpus`: bf16 TFLOP/s, HBM GB (binary: GiB), HBM TB/s; copied, never read at run time.
PUBLISHED_GPUS = {
    "a100-sxm-80gb": (312, 80, 2.039),
    "h100-sxm-80gb": (989.4, 80, 3.35),
    "h200-sxm-141gb": (989, 141, 4.8),
    "mi250x": (383, 128, 3.28),
    "mi300x": (1300, 192, 5.3),
}
# published.yaml `max_achievable_matmul_bf16` efficiencies (mi250x row is per GCD, same fraction).
PUBLISHED_MAX_EFFICIENCY = {"a100-sxm-80gb": 0.859, "h100-sxm-80gb": 0.801, "mi250x": 0.767, "mi300x": 0.601}


@pytest.mark.parametrize("name", sorted(PUBLISHED_GPUS))
def test_catalogue_matches_published(name):
    """Peak bf16, HBM capacity and bandwidth equal the published.yaml figures."""
    tflops, hbm_gb, hbm_tbps = PUBLISHED_GPUS[name]
    gpu = get_gpu(name)
    assert gpu.peak_flops_per_s["bf16"] == pytest.approx(tflops * 1e12)
    assert gpu.hbm_bytes == hbm_gb * 2**30
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(hbm_tbps * 1e12, rel=1e-3)


@pytest.mark.parametrize("name", sorted(PUBLISHED_MAX_EFFICIENCY))
def test_max_efficiency_matches_published(name):
    """The GEMM efficiency cap is the published max achievable matmul fraction."""
    assert get_gpu(name).matmul_efficiency_max == PUBLISHED_MAX_EFFICIENCY[name]


def test_mi250x_gcd_is_half_a_package():
    """One MI250X GCD has half the package's peak, memory and bandwidth (published 191.5 TFLOP/s)."""
    package, gcd = get_gpu("mi250x"), get_gpu("mi250x-gcd")
    assert gcd.peak_flops_per_s["bf16"] == pytest.approx(191.5e12)
    assert 2 * gcd.peak_flops_per_s["bf16"] == pytest.approx(package.peak_flops_per_s["bf16"])
    assert 2 * gcd.hbm_bytes == package.hbm_bytes
    assert 2 * gcd.hbm_bandwidth_bytes_per_s == pytest.approx(package.hbm_bandwidth_bytes_per_s)


def test_every_entry_is_complete():
    """Every GPU has bf16/fp16/fp32 peaks, a source, and a PCIe A100 exists for commodity clusters."""
    assert {"a100-pcie-40gb", "a100-pcie-80gb"} <= set(GPU_TYPES)
    for gpu in GPU_TYPES.values():
        assert {"bf16", "fp16", "fp32"} <= set(gpu.peak_flops_per_s)
        assert gpu.peak_flops_per_s["fp32"] < gpu.peak_flops_per_s["bf16"]
        assert 0 < gpu.matmul_efficiency_max < 1 and 0 < gpu.memory_efficiency_max < 1
        assert gpu.source


def test_fp8_only_where_the_hardware_has_it():
    """Hopper and MI300X list fp8 at twice bf16; Ampere and MI250X do not list it."""
    for name in ("h100-sxm-80gb", "h200-sxm-141gb", "mi300x"):
        peak = get_gpu(name).peak_flops_per_s
        assert peak["fp8"] == pytest.approx(2 * peak["bf16"], rel=0.01)
    for name in ("a100-sxm-80gb", "mi250x"):
        assert "fp8" not in get_gpu(name).peak_flops_per_s


def test_unknown_gpu_lists_known_names():
    """An unknown name raises ConfigError naming it and every known type."""
    with pytest.raises(ConfigError) as err:
        get_gpu("a100-sxm4-80gb")
    message = str(err.value)
    assert "'a100-sxm4-80gb'" in message
    for name in GPU_TYPES:
        assert name in message


def test_register_custom_gpu():
    """register_gpu adds a type get_gpu finds; a duplicate needs replace=True."""
    spec = make_gpu("test-gpu", {"bf16": 100, "fp16": 100, "fp32": 50}, 10, 24, 1.0, 0.8, "test")
    try:
        register_gpu(spec)
        assert get_gpu("test-gpu") is spec
        with pytest.raises(ConfigError, match="already registered"):
            register_gpu(spec)
        register_gpu(spec, replace=True)
    finally:
        GPU_TYPES.pop("test-gpu", None)


def test_spec_is_immutable_and_hashable():
    """GpuSpec is frozen, its peak table read-only, and it can key a dict."""
    gpu = get_gpu("a100-sxm-80gb")
    with pytest.raises(TypeError):
        gpu.peak_flops_per_s["bf16"] = 1.0
    assert {gpu: 1}[gpu] == 1

"""emulator/workloads/data_parallel.py: model states under ZeRO, gradient buckets, the exposed tail."""

import pytest

from emulator.workloads.data_parallel import (
    data_parallel_tail_ns,
    gathers_after_step,
    gathers_every_layer,
    gradient_buckets,
    gradient_collective,
    model_state_bytes,
    optimizer_params,
    zero3_pass_ns,
    zero_stages,
)


def test_zero_model_states_per_gpu_follow_rajbhandari():
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, fp16 mixed-precision Adam (K = 12) over
    64 ranks take 120 GB per GPU plainly, 31.4 GB with ZeRO 1, 16.6 GB with ZeRO 2, 1.9 GB with 3."""
    psi, nd = 7_500_000_000, 64
    per_gpu = [sum(model_state_bytes(psi, "fp16", zero, nd)) / 1e9 for zero in (0, 1, 2, 3)]
    # 2+2+12 bytes per parameter; ZeRO 1 divides the 12, ZeRO 2 the 2+12, ZeRO 3 all 16
    assert per_gpu == pytest.approx([120.0, 30 + 90 / 64, 15 + 105 / 64, 120 / 64])
    assert [round(gb, 1) for gb in per_gpu] == [120.0, 31.4, 16.6, 1.9]
    # bf16 keeps fp32 main gradients (Megatron): 2 + 4 + 12 bytes per parameter
    assert sum(model_state_bytes(psi, "bf16", 0, nd)) == 18 * psi
    assert model_state_bytes(psi, "bf16", 3, nd) == (2 * psi // nd, 4 * psi // nd, 12 * psi // nd)


def test_zero_shards_and_collectives():
    assert optimizer_params(1000, 0, 8) == 1000 and optimizer_params(1000, 1, 8) == 125
    assert gradient_collective(0) == "all_reduce"
    assert {gradient_collective(z) for z in (1, 2, 3)} == {"reduce_scatter"}
    assert zero_stages(1) == (0,) and zero_stages(2) == (0, 1, 2, 3)
    assert [gathers_every_layer(z) for z in range(4)] == [False, False, False, True]
    assert [gathers_after_step(z) for z in range(4)] == [False, True, True, False]


def test_gradient_buckets_fill_then_flush():
    """10 layers of 10 bytes in buckets of 25: sent after layers 2, 5 and 8, the last 10 at the end."""
    assert gradient_buckets(10, 10, 25) == ({2: 30, 5: 30, 8: 30}, 10)
    assert gradient_buckets(4, 10, 1000) == ({}, 40)
    launched, rest = gradient_buckets(24, 7_000_000, 40 << 20)
    assert sum(launched.values()) + rest == 24 * 7_000_000


def test_data_parallel_tail():
    """Buckets hidden behind the remaining backward cost nothing; the last one is exposed."""
    # 10 layers of 100 ns, 10 bytes each, buckets of 50 bytes (5 layers), a bucket takes 40 ns:
    # the first ends at 540 (hidden), the second starts at 1000 and ends at 1040: 40 exposed
    assert data_parallel_tail_ns(100, 10, 1000, 1, 1, 10, 50, lambda size: 40) == 40
    # buckets longer than the layers queue up on the dp stream: five of 300 ns from 200 ns on
    assert data_parallel_tail_ns(100, 10, 1000, 1, 1, 10, 20, lambda size: 300) == 200 + 5 * 300 - 1000
    # with the ports shared with tensor-parallel collectives a bucket stalls the backward
    assert data_parallel_tail_ns(100, 10, 1000, 1, 1, 10, 50, lambda size: 40, shared_ports=True) == 40 + 40


def test_zero3_pass():
    assert zero3_pass_ns(100, 30, 4) == 30 + 3 * 100 + 100  # gathers hidden but the first
    assert zero3_pass_ns(100, 150, 4) == 150 + 3 * 150 + 100  # gather-bound
    assert zero3_pass_ns(100, 30, 4, shared_lead_ns=10, tp_ns=20) == 30 + 3 * (100 + 20) + 100
    assert zero3_pass_ns(100, 30, 0) == 0

"""Human units of the report: memory binary, traffic and bandwidth decimal, times scaled."""

from __future__ import annotations

from emulator.results import units


def test_memory_is_binary():
    """Memory in GiB (as GPU capacity is stated), smaller sizes in MiB/KiB/B."""
    assert units.memory(16463966208) == "15.33 GiB"
    assert units.memory(80 << 30) == "80.00 GiB"
    assert units.memory(3 << 20) == "3 MiB" and units.memory(1536) == "1.5 KiB" and units.memory(0) == "0 B"


def test_traffic_and_rates_are_decimal():
    """Bytes over the network in TB/GB/..., bandwidth in GB/s (nccl-tests' units)."""
    assert units.traffic(625588284948480) == "625.6 TB"
    assert units.traffic(21_760_000_000_000) == "21.76 TB" and units.traffic(153_200_000_000) == "153.2 GB"
    assert units.traffic(2_500_000_000_000_000) == "2.5 PB" and units.traffic(999) == "999 B"
    assert units.rate_GBps(191.41e9) == "191.4 GB/s"


def test_durations_scale_to_the_largest_fitting_unit():
    """Seconds, milliseconds, microseconds, nanoseconds; zero is 0 s."""
    assert units.duration_s(13.066262) == "13.07 s"
    assert units.duration_s(0.0131) == "13.1 ms"
    assert units.duration_ns(1500) == "1.5 µs" and units.duration_ns(12) == "12 ns"
    assert units.duration_s(0) == "0 s"


def test_counts_percentages_and_missing_values():
    """Thousands separators, one decimal for percentages, '-' for a figure a run does not have."""
    assert units.count(3480064) == "3,480,064" and units.percent(0.5411) == "54.1%"
    assert all(f(None) == "-" for f in (units.memory, units.traffic, units.duration_s, units.rate_GBps,
                                        units.percent, units.count))  # fmt: skip

"""Numbers in units a reader takes in at a glance (used by the HTML report).

    >>> traffic(625588284948480), memory(16463966208), duration_s(0.0131), rate_GBps(191.4e9)
    ('625.6 TB', '15.33 GiB', '13.1 ms', '191.4 GB/s')

Memory is binary (GiB, as the GPU datasheets and ``emulator check`` state capacity); traffic and
bandwidth are decimal (TB, GB/s, as nccl-tests and NIC datasheets do). Every function takes the raw
figure (bytes, seconds, bytes per second) and returns text; ``None`` becomes ``-``.
"""

from __future__ import annotations

MISSING = "-"


def _scaled(value: float, units: tuple[tuple[str, float], ...], digits: int) -> str:
    """``value`` in the first unit it reaches at least 1 of (the last unit otherwise)."""
    for unit, scale in units:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {unit}"
    unit, scale = units[-1]
    return f"{value / scale:.{digits}g} {unit}"


def memory(size_bytes: float | None) -> str:
    """Bytes of memory in GiB/MiB/KiB (binary), two decimals from GiB on."""
    if size_bytes is None:
        return MISSING
    if abs(size_bytes) >= 1 << 30:
        return f"{size_bytes / (1 << 30):.2f} GiB"
    return _scaled(size_bytes, (("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)), 4)


def traffic(size_bytes: float | None) -> str:
    """Bytes moved over a network in PB/TB/GB/MB/kB (decimal)."""
    if size_bytes is None:
        return MISSING
    return _scaled(size_bytes, (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1)), 4)


def duration_s(seconds: float | None) -> str:
    """A virtual or wall time in s/ms/µs/ns."""
    if seconds is None:
        return MISSING
    if seconds == 0:
        return "0 s"
    return _scaled(seconds, (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)), 4)


def duration_ns(ns: float | None) -> str:
    return MISSING if ns is None else duration_s(ns / 1e9)


def rate_GBps(bytes_per_s: float | None) -> str:
    """A bandwidth or throughput in GB/s (decimal, as nccl-tests reports it)."""
    if bytes_per_s is None:
        return MISSING
    return f"{bytes_per_s / 1e9:.4g} GB/s"


def percent(fraction: float | None, digits: int = 1) -> str:
    return MISSING if fraction is None else f"{100 * fraction:.{digits}f}%"


def count(n: float | None) -> str:
    """An integer count with thousands separators (events, messages)."""
    return MISSING if n is None else f"{round(n):,}"

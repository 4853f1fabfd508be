"""The message core's message statistics (compiled; netkernels.py): a size's histogram bucket
and the per-tier timeline of bytes (ShardStats.messages' rules, which netcore.NetCore.flush adds to)."""

from __future__ import annotations

from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netlayout import NO_LIMIT, PEND_N


@njit(cache=True, inline="always")
def _bit_length(x):
    b = 0
    while x > 0:
        x >>= 1
        b += 1
    return b


@njit(cache=True, inline="always")
def timeline_add(tl, pend, st, tier, size, count, t, t_end, bucket):
    """ShardStats.messages' timeline rule (bytes spread pro rata over the buckets a message spans);
    rows beyond ``tl`` or at risk of int64 overflow go to ``pend`` for Python to add exactly."""
    slot = t // bucket
    single = t_end <= t or (t_end - 1) // bucket == slot
    last = slot if single else (t_end - 1) // bucket
    if last >= tl.shape[1] or (not single and size > 0 and t_end - t > (NO_LIMIT // size)):
        n = st[PEND_N]
        st[PEND_N] = n + 1
        pend[n, 0] = tier
        pend[n, 1] = size
        pend[n, 2] = count
        pend[n, 3] = t
        pend[n, 4] = t_end
        return
    if single:
        tl[tier, slot] += size * count
        return
    done = 0
    for s in range(slot, last + 1):
        part = size * (min(t_end, (s + 1) * bucket) - t) // (t_end - t) - done
        tl[tier, s] += part * count
        done += part

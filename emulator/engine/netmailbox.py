"""The message core's mailbox (compiled; netkernels.py): one hash table of the messages handed
over before their receiver asked for them, the collective channels waiting for a message, and the
point-to-point receives waiting for one (``hts``: which of the three a slot holds)."""

from __future__ import annotations

import numpy as np
from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netlayout import HT_EMPTY, HT_FILL


# -- hash table: (dst, gid, call #, chan, src, k) -> message or waiting channel ------------------
# Linear probing with backward-shift deletion (no tombstones, so probes stay short however many
# messages pass through).
@njit(cache=True, inline="always")
def _hash(k0, k1, k2, k3, k4, k5, mask):
    h = np.uint64(k0) * np.uint64(0x9E3779B97F4A7C15)
    h = (h ^ np.uint64(k1)) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ np.uint64(k2)) * np.uint64(0x94D049BB133111EB)
    h = (h ^ np.uint64(k3)) * np.uint64(0x9E3779B97F4A7C15)
    h = (h ^ np.uint64(k4)) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ np.uint64(k5)) * np.uint64(0x94D049BB133111EB)
    # splitmix64's finaliser: the products above only carry low bits upwards, and the table is
    # indexed by the low bits (ring neighbours' keys would cluster into long probe runs)
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, inline="always")
def _ht_find(htk, hts, state, k0, k1, k2, k3, k4, k5):
    """Slot holding the key with ``state``, or -1."""
    mask = htk.shape[0] - 1
    i = _hash(k0, k1, k2, k3, k4, k5, mask)
    while True:
        s = hts[i]
        if s == HT_EMPTY:
            return -1
        if (s == state and htk[i, 4] == k4 and htk[i, 5] == k5 and htk[i, 0] == k0 and htk[i, 1] == k1
                and htk[i, 2] == k2 and htk[i, 3] == k3):  # fmt: skip
            return i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _ht_insert(htk, hts, st, state, k0, k1, k2, k3, k4, k5):
    """Insert a key known to be absent; returns its slot."""
    mask = htk.shape[0] - 1
    i = _hash(k0, k1, k2, k3, k4, k5, mask)
    while hts[i] != HT_EMPTY:
        i = (i + 1) & mask
    st[HT_FILL] += 1
    hts[i] = state
    htk[i, 0] = k0
    htk[i, 1] = k1
    htk[i, 2] = k2
    htk[i, 3] = k3
    htk[i, 4] = k4
    htk[i, 5] = k5
    return i


@njit(cache=True, inline="always")
def _ht_delete(htk, htv, hts, st, i):
    """Empty slot ``i``, moving back the entries of its probe run that would become unreachable."""
    mask = htk.shape[0] - 1
    st[HT_FILL] -= 1
    j = i
    while True:
        j = (j + 1) & mask
        if hts[j] == HT_EMPTY:
            break
        h = _hash(htk[j, 0], htk[j, 1], htk[j, 2], htk[j, 3], htk[j, 4], htk[j, 5], mask)
        # the entry at j may move to i unless its home h lies cyclically in (i, j]
        if (i < j and i < h <= j) or (i > j and (h > i or h <= j)):
            continue
        hts[i] = hts[j]
        for c in range(6):
            htk[i, c] = htk[j, c]
        for c in range(4):
            htv[i, c] = htv[j, c]
        i = j
    hts[i] = HT_EMPTY


@njit(cache=True)
def rehash(htk, htv, hts, nk, nv, ns, st):
    """Move every entry into the larger (empty) table ``nk, nv, ns``."""
    st[HT_FILL] = 0
    for i in range(hts.shape[0]):
        s = hts[i]
        if s != HT_EMPTY:
            j = _ht_insert(nk, ns, st, s, htk[i, 0], htk[i, 1], htk[i, 2], htk[i, 3], htk[i, 4], htk[i, 5])
            for c in range(4):
                nv[j, c] = htv[i, c]

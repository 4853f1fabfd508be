"""The message core's event heap (compiled; netkernels.py): ``(time, kind, rank, origin, seq,
payload)`` rows of hand-overs, collective steps and point-to-point receives' completions, ordered
by the first five columns as the shard orders its own heap's keys (netkernels' module doc)."""

from __future__ import annotations

from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netlayout import HEAP_N, TOP_KIND, TOP_ORIGIN, TOP_RANK, TOP_SEQ, TOP_T


@njit(cache=True, inline="always")
def _less(a0, a1, a2, a3, a4, heap, r) -> bool:
    """Whether the key ``(a0, .., a4)`` precedes heap row ``r`` (row views would cost refcounts)."""
    if a0 != heap[r, 0]:
        return a0 < heap[r, 0]
    if a1 != heap[r, 1]:
        return a1 < heap[r, 1]
    if a2 != heap[r, 2]:
        return a2 < heap[r, 2]
    if a3 != heap[r, 3]:
        return a3 < heap[r, 3]
    return a4 < heap[r, 4]


@njit(cache=True, inline="always")
def _push(heap, st, t, kind, rank, origin, seq, payload):
    i = st[HEAP_N]
    st[HEAP_N] = i + 1
    _rise(heap, i, t, kind, rank, origin, seq, payload)


@njit(cache=True, inline="always")
def _rise(heap, i, t, kind, rank, origin, seq, payload):
    """Put the row at the hole ``i`` or above it, its parents that follow it moved down (a push's
    sift-up, and the end of a pop)."""
    while i > 0:
        p = (i - 1) >> 1
        if _less(t, kind, rank, origin, seq, heap, p):
            for j in range(6):
                heap[i, j] = heap[p, j]
            i = p
        else:
            break
    heap[i, 0] = t
    heap[i, 1] = kind
    heap[i, 2] = rank
    heap[i, 3] = origin
    heap[i, 4] = seq
    heap[i, 5] = payload


@njit(cache=True, inline="always")
def _pop(heap, st):
    """Remove the top row; the caller has read it. As opheap._pop, Floyd's order of work: the hole
    goes down to a leaf along the smaller child (one comparison of keys a level instead of two),
    then the last row rises from there to its place (the keys are unique: the same order)."""
    n = st[HEAP_N] - 1
    st[HEAP_N] = n
    if n == 0:
        return
    a0, a1, a2, a3, a4, a5 = heap[n, 0], heap[n, 1], heap[n, 2], heap[n, 3], heap[n, 4], heap[n, 5]
    i = 0
    c = 1
    while c < n:
        if c + 1 < n and _less(heap[c + 1, 0], heap[c + 1, 1], heap[c + 1, 2], heap[c + 1, 3], heap[c + 1, 4], heap, c):
            c += 1
        for j in range(6):
            heap[i, j] = heap[c, j]
        i = c
        c = 2 * i + 1
    _rise(heap, i, a0, a1, a2, a3, a4, a5)


@njit(cache=True, inline="always")
def _top_before(heap, l0, l1, l2, l3, l4) -> bool:
    """Whether the heap's top key precedes ``(l0, .., l4)``."""
    if heap[0, 0] != l0:
        return heap[0, 0] < l0
    if heap[0, 1] != l1:
        return heap[0, 1] < l1
    if heap[0, 2] != l2:
        return heap[0, 2] < l2
    if heap[0, 3] != l3:
        return heap[0, 3] < l3
    return heap[0, 4] < l4


@njit(cache=True, inline="always")
def _set_top(st, heap):
    if st[HEAP_N] == 0:
        st[TOP_T] = -1
        return
    st[TOP_T] = heap[0, 0]
    st[TOP_KIND] = heap[0, 1]
    st[TOP_RANK] = heap[0, 2]
    st[TOP_ORIGIN] = heap[0, 3]
    st[TOP_SEQ] = heap[0, 4]

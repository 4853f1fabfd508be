"""The compiled per-op engine's event heap and op ring (split from opkernels.py): an event pushed
and popped with its ``(t, rank << SEQ_BITS | seq, op)`` key, an op taken from the rank's ring of
slots, its dependencies, and its slot given back.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import prefetch as _prefetch
from emulator.engine.kernel_memory import prefetch_w as _prefetch_w
from emulator.engine.oplayout import (
    G_ERR,
    G_HEAPN,
    G_RING,
    MAX_DEPS,
    O_DEP0,
    O_DEPS,
    O_FIELDS,
    O_GATE,
    O_KIND,
    O_LAST,
    O_LOST,
    O_NDEP,
    O_NEXT,
    O_RI,
    O_STATE,
    O_TSTART,
    O_VAL,
    R_LASTC,
    R_NWAIT,
    R_PEND,
    R_RING,
    R_WAIT0,
    S_DONE,
    S_LAUNCHED,
    SEQ_BITS,
    SEQ_LIMIT,
)


@njit(cache=True, inline="always")
def _prefetch_row(ops, op):
    """Both lines of op ``op``'s row (O_FIELDS int64: two 64-byte lines, OpCore aligns the table)."""
    at = ops.ctypes.data + op * (O_FIELDS * 8)
    _prefetch(at)
    _prefetch(at + 64)


@njit(cache=True, inline="always")
def _push(heap, g, t, rank, seq, op):
    """Push the event ``(t, EV_OP_DONE, rank, rank, seq)``: the row ``(t, rank << SEQ_BITS | seq, op)``,
    ordered as that key (its kind and origin are the same on every row)."""
    if seq >= SEQ_LIMIT:
        g[G_ERR] = 3  # the packed key's bound (OpCore bounds the ranks)
    i = g[G_HEAPN]
    g[G_HEAPN] = i + 1
    _rise(heap, i, t, (rank << SEQ_BITS) | seq, op)


@njit(cache=True, inline="always")
def _rise(heap, i, t, key, op):
    """Put the row ``(t, key, op)`` at the hole ``i`` or above it, its parents that follow it moved
    down (a push's sift-up, and the end of a pop)."""
    while i > 0:
        p = (i - 1) >> 1
        pt = heap[p, 0]
        if t < pt or (t == pt and key < heap[p, 1]):
            heap[i, 0], heap[i, 1], heap[i, 2] = pt, heap[p, 1], heap[p, 2]
            i = p
        else:
            break
    heap[i, 0], heap[i, 1], heap[i, 2] = t, key, op


@njit(cache=True, inline="always")
def _pop(heap, g):
    """Remove the top row (the caller has read it). Floyd's order of work: the hole the top leaves
    goes down to a leaf along the smaller child (one comparison a level, its outcome added to the
    index: no branch that the keys decide, where the usual sift-down mispredicted one or two a
    level, half of the event loop's time; the next level's rows asked for ahead), then the heap's
    last row rises from there to its place (it came from the bottom: it rarely rises far). Keys
    are unique (a rank's seq), so the rows come out in the same order whatever the heap's shape."""
    n = g[G_HEAPN] - 1
    g[G_HEAPN] = n
    t, key, op = heap[n, 0], heap[n, 1], heap[n, 2]
    i = 0
    c = 1
    while c < n:
        # the rows of the next level's two candidates' children (2c+1 .. 2c+4: 96 bytes, up to three
        # lines), asked for before this level's comparison decides: that level reads them from L1
        at = heap.ctypes.data + (2 * c + 1) * 24
        _prefetch(at)
        _prefetch(at + 64)
        _prefetch(at + 95)
        # (unsigned indices: numba adds no wrap-around of a negative one on the chain of loads)
        r = np.uint64(c)
        if c + 1 < n:
            d = np.uint64(c + 1)
            ct, dt = heap[r, 0], heap[d, 0]
            c += (dt < ct) | ((dt == ct) & (heap[d, 1] < heap[r, 1]))
            r = np.uint64(c)
        h = np.uint64(i)
        heap[h, 0], heap[h, 1], heap[h, 2] = heap[r, 0], heap[r, 1], heap[r, 2]
        i = c
        c = 2 * i + 1
    _rise(heap, i, t, key, op)


@njit(cache=True, inline="always")
def _new_op(rs, ops, g, ri, kind, value):
    ring = g[G_RING]
    n = rs[ri, R_RING]
    rs[ri, R_RING] = n + 1
    # (OpCore sizes the ring as a power of two: a mask, not a division)
    op = ri * ring + ((n & (ring - 1)) if ring & (ring - 1) == 0 else n % ring)
    # the rank's next slots, written by the next launches: a ring ago, out of the caches by now
    _prefetch_w(ops.ctypes.data + (op + 2) * (O_FIELDS * 8))
    _prefetch_w(ops.ctypes.data + (op + 2) * (O_FIELDS * 8) + 64)
    if n >= ring and ops[op, O_STATE] != S_DONE:
        g[G_ERR] = 1  # the ring is too short for the ops in flight (an engine bug)
    ops[op, O_KIND] = kind
    ops[op, O_VAL] = value
    ops[op, O_STATE] = S_LAUNCHED
    ops[op, O_DEPS] = 0
    ops[op, O_TSTART] = 0
    ops[op, O_NEXT] = -1
    ops[op, O_LAST] = 0
    ops[op, O_GATE] = 0
    ops[op, O_RI] = ri
    ops[op, O_NDEP] = 0
    ops[op, O_LOST] = 0
    return op


@njit(cache=True, inline="always")
def _add_dep(ops, g, op, on):
    """``op`` waits for ``on`` (not done): Shard.launch's dependents list."""
    n = ops[on, O_NDEP]
    if n >= MAX_DEPS:
        g[G_ERR] = 1
        return
    ops[on, O_DEP0 + n] = op
    ops[on, O_NDEP] = n + 1
    ops[op, O_DEPS] += 1


@njit(cache=True, inline="always")
def _forget(rs, ri, op):
    """The rank's references to ``op``, done, that launch_rest may read later (the compute stream's
    last op, the overlapped collective, the waited ones) become -1 (done): its slot may be reused
    before they are read, so a reference never outlives its op (OpCore sizes the ring by the ops in
    flight alone)."""
    if rs[ri, R_LASTC] == op:
        rs[ri, R_LASTC] = -1
    if rs[ri, R_PEND] == op:
        rs[ri, R_PEND] = -1
    for k in range(rs[ri, R_NWAIT]):
        if rs[ri, R_WAIT0 + k] == op:
            rs[ri, R_WAIT0 + k] = -1

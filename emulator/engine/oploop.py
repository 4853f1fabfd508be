"""The event loop of the compiled per-op engine (split from opkernels.py): ``_run_at`` pops the heap's
events up to the shard's next one (its key limit) or the horizon and completes them, the ops it
completes next prefetched (``_ahead``).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import prefetch as _prefetch
from emulator.engine.kernel_memory import void_ptr as _void_ptr
from emulator.engine.netkernels import T_ST, TOP_KIND, TOP_ORIGIN, TOP_RANK, TOP_SEQ, TOP_T
from emulator.engine.opheap import _pop, _prefetch_row
from emulator.engine.oplayout import (
    A_G,
    A_HEAP,
    A_OF,
    A_OPS,
    A_RF,
    A_RS,
    G_ERR,
    G_EVENTS,
    G_HEAPN,
    G_LOW,
    G_NET,
    G_RDRAIN,
    G_SENT,
    G_STATUS,
    K_R,
    K_S,
    NET_EVENT,
    O_DEP0,
    O_FIELDS,
    O_KIND,
    O_NDEP,
    O_NEXT,
    O_RI,
    R_FIELDS,
    SEQ_BITS,
    SEQ_MASK,
    ST_LIMIT,
    _f1,
    _i1,
    _i2,
    _table,
)
from emulator.engine.opsends import _complete_send, _net, _net_room, _recv_done, _recv_rest
from emulator.engine.opstreams import _complete, _try_c


@njit(cache=True, inline="always")
def _ahead(ops, of, op):
    """Ask for what the completion of ``op`` (the next event's) reads: its row, its FLOPs, the
    stream's next op and its dependents (their rows; ``op``'s row was asked for an event earlier)."""
    _prefetch_row(ops, op)
    _prefetch(of.ctypes.data + op * 8)
    nxt = ops[op, O_NEXT]
    if nxt >= 0:
        _prefetch_row(ops, nxt)
    for k in range(ops[op, O_NDEP]):
        _prefetch(ops.ctypes.data + ops[op, O_DEP0 + k] * (O_FIELDS * 8))


@njit(cache=True)
def _run_at(P, lt, lk, lr, lo, ls, horizon):
    """Process this heap's events whose keys precede ``(lt, lk, lr, lo, ls)`` (the shard's other
    heaps' next key) and whose time is before ``horizon``; stop where Python must act.

    The op table is larger than the caches (every rank's ops in flight: 25 MiB for the reference
    run), and an event's rows were last touched when the op was launched or started, long before:
    waiting for them was most of an event's time. So each event asks for what the next one reads
    (the heap's top after the pop: its row, and from it the stream's next op and the dependents,
    _ahead) and for the rows of the one after (one of the top's two children: both)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    of = _f1(P, A_OF)
    rf = _f1(P, A_RF)
    heap = _i2(P, A_HEAP, 3)
    g = _i1(P, A_G)
    sends = g[G_NET] != 0
    while g[G_HEAPN] > 0:
        t = heap[0, 0]
        if t >= horizon:
            break
        if sends and _net_room(P) < NET_EVENT:
            g[G_LOW] = 1  # OpCore grows the message core's arrays; the shard's loop calls again
            break
        # the key (t, EV_OP_DONE=2, rank, rank, seq) against the limit
        if t > lt:
            break
        if t == lt:
            if 2 > lk:
                break
            if 2 == lk:
                rank, seq = heap[0, 1] >> SEQ_BITS, heap[0, 1] & SEQ_MASK
                if rank > lr or (rank == lr and (rank > lo or (rank == lo and seq > ls))):
                    break
        op = heap[0, 2]
        _pop(heap, g)
        n = g[G_HEAPN]
        if n > 0:
            _ahead(ops, of, heap[0, 2])
            # the next event after that is one of the top's children now (or one pushed later)
            if n > 1:
                _prefetch_row(ops, heap[1, 2])
            if n > 2:
                _prefetch_row(ops, heap[2, 2])
        g[G_EVENTS] += 1
        kind = ops[op, O_KIND]
        if kind == K_S:
            status = _complete_send(P, ops[op, O_RI], op, t)
        elif kind == K_R:  # a receive whose message was in the mailbox, delivered now
            ri = ops[op, O_RI]
            status = ST_LIMIT
            if _recv_done(P, ri, op, t) >= 0:
                status = _try_c(P, ri, t)
            status = _recv_rest(P, ri, op, t, status)
        else:
            status = _complete(P, rs, ops, of, rf, g, ops[op, O_RI], op, t)
        if g[G_ERR]:
            return
        if g[G_RDRAIN]:  # Python's ops behind a receive stream first (OpCore._net_after), then the status
            g[G_STATUS] = status
            return
        if g[G_SENT]:
            # a hand-over pushed in the message core's heap may precede the limit: the loop stops before it
            pn = _net(P)
            nst = carray(_void_ptr(pn[3 * T_ST]), pn[3 * T_ST + 1], np.int64)
            ht, hk, hr, ho, hs = nst[TOP_T], nst[TOP_KIND], nst[TOP_RANK], nst[TOP_ORIGIN], nst[TOP_SEQ]
            if ht >= 0 and (ht < lt or (ht == lt and (hk < lk or (hk == lk and (
                    hr < lr or (hr == lr and (ho < lo or (ho == lo and hs < ls)))))))):  # fmt: skip
                lt, lk, lr, lo, ls = ht, hk, hr, ho, hs
        if status != ST_LIMIT:
            g[G_STATUS] = status
            return
    g[G_STATUS] = ST_LIMIT


@njit(cache=True)
def _run(rs, ops, of, rf, pl, plk, free, qn, qm, tl, ovf, heap, g, gr, lt, lk, lr, lo, ls, horizon):  # fmt: skip
    """_run_at over arrays (the tests call the loop this way; no template is read: ti, tf and tp
    stand for themselves by arrays never indexed)."""
    P = _table(rs, ops, of, rf, rs, of, rs, pl, plk, free, qn, qm, tl, ovf, heap, g, gr)
    _run_at(P + (P[A_RS], P[A_RS], P[A_RS]), lt, lk, lr, lo, ls, horizon)

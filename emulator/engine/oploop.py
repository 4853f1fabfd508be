"""The event loop of the compiled per-op engine (split from opkernels.py): ``_run_at`` pops the heap's
events up to the shard's next one (its key limit) or the horizon and completes them, the ops it
completes next prefetched (``_ahead``); ``_run_net_at`` runs the message core's events
(netkernels.run_events) and completes there the tapes' receives their hand-overs complete
(``_recv_complete``), without a return to Python for each.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import prefetch as _prefetch
from emulator.engine.kernel_memory import void_ptr as _void_ptr
from emulator.engine.netkernels import (
    NO_LIMIT,
    RECV_DONE,
    RET_RUN,
    RET_T,
    T_ST,
    TOP_KIND,
    TOP_ORIGIN,
    TOP_RANK,
    TOP_SEQ,
    TOP_T,
    run_events,
)
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
    G_KRECV_T,
    G_KRECVS,
    G_LOW,
    G_NET,
    G_NOVF,
    G_RDRAIN,
    G_RET_RI,
    G_RET_T,
    G_SENT,
    G_STATUS,
    K_R,
    K_S,
    NET_EVENT,
    NET_KRECV,
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
from emulator.engine.opsends import _complete_send, _net, _net_room, _note_room, _recv_done, _recv_rest
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


@njit(cache=True, inline="always")
def _recv_complete(P, ri, op, t):
    """Shard._complete of a kernel receive ``op`` of rank index ``ri`` done at ``t``: its counts and
    dependents (_recv_done), the compute stream's head it released (_try_c), its stream's next ops
    and the program's check (_recv_rest); their status."""
    status = ST_LIMIT
    if _recv_done(P, ri, op, t) >= 0:
        status = _try_c(P, ri, t)
    return _recv_rest(P, ri, op, t, status)


@njit(cache=True, inline="always")
def _key_before(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    """Whether the event key ``(a0, .., a4)`` precedes ``(b0, .., b4)`` (the shard's order of keys)."""
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    if a2 != b2:
        return a2 < b2
    if a3 != b3:
        return a3 < b3
    return a4 < b4


@njit(cache=True)
def _complete_recv(P, op, t):
    """A kernel receive ``op`` completes at its hand-over's event (the message core's RECV_DONE): as
    Shard._complete, its rank index and ``t`` in G_RET_RI / G_RET_T (OpCore.complete_recv reads
    them), its status in G_STATUS (an instant op's, ST_RESUME, ST_RMISMATCH, ST_LIMIT)."""
    ops = _i2(P, A_OPS, O_FIELDS)
    g = _i1(P, A_G)
    ri = ops[op, O_RI]
    g[G_RET_RI] = ri
    g[G_RET_T] = t
    g[G_STATUS] = _recv_complete(P, ri, op, t)
    _note_room(P)


@njit(cache=True)
def _run_net_at(P, lt, lk, lr, lo, ls, horizon):
    """The message core's events before ``horizon`` whose keys precede ``(lt, lk, lr, lo, ls)`` (the
    shard's Python heap's next key) and this heap's next key (netkernels.run_events, called again
    after each receive it completes); a tape's receive that a hand-over completed (RECV_DONE of a
    kernel receive, run id < -1: p2p.PointToPoint._core_receive) completes here (_complete_recv),
    and the run goes on where Python would do nothing after it (OpCore.complete_recv: status
    ST_LIMIT, no error, overflow, room to grow, drained stream, nor a time past the engine's
    range). Returns run_events' status, or NET_KRECV where Python goes on after such a
    completion (as after complete_recv: st[RET_RUN], st[RET_T] name it). Every completion here
    counts in G_KRECVS, the last one's time in G_KRECV_T (-1: none in this call).

    The stop rule is the shard's loop's (dedicated._run_until_compiled): a completion may push
    events in this heap (the block it released starts) that precede the limit: the next
    run_events call stops before them, and Python runs them (OpCore.run)."""
    heap = _i2(P, A_HEAP, 3)
    g = _i1(P, A_G)
    pn = _net(P)
    nst = carray(_void_ptr(pn[3 * T_ST]), pn[3 * T_ST + 1], np.int64)
    g[G_KRECV_T] = -1
    while True:
        l0, l1, l2, l3, l4 = lt, lk, lr, lo, ls
        if g[G_HEAPN] > 0:  # this heap's top (OpCore.top_key): (t, EV_OP_DONE=2, rank, rank, seq)
            ht, rank, seq = heap[0, 0], heap[0, 1] >> SEQ_BITS, heap[0, 1] & SEQ_MASK
            if _key_before(ht, 2, rank, rank, seq, l0, l1, l2, l3, l4):
                l0, l1, l2, l3, l4 = ht, 2, rank, rank, seq
        status = run_events(pn, l0, l1, l2, l3, l4, horizon)
        run = nst[RET_RUN]
        if status != RECV_DONE or run >= -1:
            return status
        t = nst[RET_T]
        _complete_recv(P, -2 - run, t)
        g[G_KRECVS] += 1
        g[G_KRECV_T] = t
        if g[G_STATUS] != ST_LIMIT or g[G_ERR] or g[G_NOVF] or g[G_LOW] or g[G_RDRAIN]:
            return NET_KRECV
        if g[G_SENT]:  # (what OpCore._net_after does after complete_recv: the core's top, read next)
            if nst[TOP_T] >= NO_LIMIT:
                return NET_KRECV  # its error (NetCore._read_top) with the receive's key
            g[G_SENT] = 0


@njit(cache=True)
def _run_at(P, lt, lk, lr, lo, ls, horizon):
    """Process this heap's events whose keys precede ``(lt, lk, lr, lo, ls)`` (the shard's other
    heaps' next key) and whose time is before ``horizon``; stop where Python must act.

    The op table is larger than the caches (every rank's ops in flight: 25 MiB for the reference
    run), and an event's rows were last touched when the op was launched or started, long before:
    waiting for them was most of an event's time. So each event asks for what the next one reads
    (the heap's top after the pop: its row, and from it the stream's next op and the dependents,
    _ahead) and for the row of the one after (the smaller of the top's two children)."""
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
            # the next event after that is the smaller of the top's children now (or one pushed
            # later): its row only (chosen without a branch; asking for both rows took page walks)
            if n > 2:
                _prefetch_row(ops, heap[1 + ((heap[2, 0] < heap[1, 0]) | ((heap[2, 0] == heap[1, 0]) & (
                    heap[2, 1] < heap[1, 1]))), 2])  # fmt: skip
            elif n > 1:
                _prefetch_row(ops, heap[1, 2])
        g[G_EVENTS] += 1
        kind = ops[op, O_KIND]
        if kind == K_S:
            status = _complete_send(P, ops[op, O_RI], op, t)
        elif kind == K_R:  # a receive whose message was in the mailbox, delivered now
            status = _recv_complete(P, ops[op, O_RI], op, t)
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

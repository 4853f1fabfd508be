"""Numba kernels of the compiled per-op engine (emulator/engine/opcore.py): the built-in workload's
op blocks (fused compute segments and the tensor group's closed-form collectives between them).

These are the rules of emulator/engine/shard.py (``launch``, ``_try_start``, ``_complete``) and of
the intra-node closed form (collective_run.py ``_rendezvous``: one arrival when the tensor group is
folded, each member's when not; netmodel/links.py
``LinkModel.hold``) for the two streams a block uses, over arrays, many events per call. Every
event has the key ``(t, EV_OP_DONE, rank, rank, seq)`` the Python path gives it, ``seq`` taken from
the rank's one counter, so the shard merges this heap with its own and the order is unchanged;
tests/emulator/engine/test_opcore.py runs both paths and compares results bit for bit.

State (all int64 unless said): ``rs[rank index, R_*]`` per rank, ``ops[op, O_*]`` per op (a ring of
``ring`` slots per rank), ``heap[i] = (t, rank << SEQ_BITS | seq, op)``, ``g[G_*]`` globals and the returned
status. Templates: ``ti[i] = (code, value, flag)`` with ``tf[i]`` the FLOPs, block ``b`` is rows
``tp[b, 0] : tp[b, 0] + tp[b, 1]``; codes ``I_C`` (compute: duration as launched, flag its charged
minus nominal ns on a slow GPU), ``I_M`` (collective: plan, flag 1 when overlapped), ``I_W`` (wait
for the overlapped one), ``I_A`` / ``I_F`` (alloc / free of ``value`` bytes, flag the row's place
in the block: OpCore finds its Allocation by it). Plans ``pl[p, P_*]`` with their ports
``plk[pl[p, P_LPTR] : + pl[p, P_LLEN]]``;
``gr`` the open call of each tensor group whose members arrive one by one (GR_*).

A tape's pipeline sends and receives (tape.py, OpCore.launch_send / launch_recv) are ops of the same
ring (K_S, K_R) on per-rank stream slots (``rs[ri, R_SS0 + slot * SS_FIELDS + SS_*]``), described
by ``sd`` rows (peer, tag, route, counter, slot, receive?) with the rank's message counters ``kc``:
the rules of p2p.py (``_start_send``, ``_start_recv``) over the message core's arrays (netkernels'
table, ``A_NET``), their completions events of this heap with the rank's ``seq``.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import prefetch as _prefetch
from emulator.engine.kernel_memory import prefetch_w as _prefetch_w
from emulator.engine.kernel_memory import void_ptr as _void_ptr
from emulator.engine.netkernels import (
    HEAP_N,
    HT_FILL,
    HT_MSG,
    HT_RECV,
    MSG_N,
    OUT_N,
    PEND_N,
    SEND_KIND,
    T_HEAP,
    T_HTK,
    T_MSG,
    T_OUTB,
    T_PEND,
    T_ST,
    TOP_KIND,
    TOP_ORIGIN,
    TOP_RANK,
    TOP_SEQ,
    TOP_T,
    X_CHAN,
    X_PEER,
    X_RID,  # fmt: skip
    X_SIZE,
    _ht_delete,
    _ht_find,
    _ht_insert,
    _inject,
    _set_top,
    _views,
)
from emulator.engine.netkernels import TABLE as _NET_TABLE

# per rank
(R_SEQ, R_OUT, R_OPSDONE, R_LAST, R_CNS, R_COMMNS, R_SUSP, R_SYNC, R_CHEAD, R_CTAIL, R_CBLK, R_LASTC,
 R_THEAD, R_TTAIL, R_TBLK, R_WCT, R_WCT_HIT, R_WTC, R_WTC_HIT, R_NWAIT, R_WAIT0) = range(21)  # fmt: skip
MAX_WAITS = 5  # (a block with more tensor collectives in a row runs the Python rules: OpCore._template)
R_PEND = R_WAIT0 + MAX_WAITS
R_BT, R_BPOS, R_RING, R_RANK = R_PEND + 1, R_PEND + 2, R_PEND + 3, R_PEND + 4
R_BEGIN = R_RANK + 1  # the template of the block the program launched and no kernel began yet, or -1
R_LOST = R_BEGIN + 1  # charged minus nominal compute of the block ops done (a slow GPU: Shard.compute_lost_ns)
# memory (shared with the Python rules, CompiledGPU.mem_used / mem_peak): bytes in use, the peak, the capacity
R_MEM, R_PEAK, R_CAP = R_LOST + 1, R_LOST + 2, R_LOST + 3
# a rank's pipeline send streams whose sends the kernels run (tape.py's kernel sends, OpCore.launch_send):
# per stream slot its head and tail op, when its head began waiting for the compute stream (-1: not),
# the ns it waited and whether it did (Shard._try_start's wait_ns[stream]["compute"]), and whether
# Python queued ops behind its sends (sealed: the kernels stop when its last send completes, ST_SDRAIN)
# (receive streams too: SS_CWAIT / SS_CHIT, the ns the compute stream waited for one of its receives,
# Shard._try_start's wait_ns["compute"][stream])
NSS = 8
SS_HEAD, SS_TAIL, SS_BLK, SS_WAIT, SS_HIT, SS_SEAL, SS_CWAIT, SS_CHIT = range(8)
SS_FIELDS = 8
R_SS0 = R_CAP + 1
# R_RPEND: a tape's receive that the block launched next waits for (-1: none; tape.py's phase 1);
# R_CBY: what released the compute stream's head last (0: the tensor stream, 1 + slot: a receive)
R_RPEND = R_SS0 + NSS * SS_FIELDS
R_CBY = R_RPEND + 1
# a tape's block chained in the kernels (EMULATOR_TAPE=blocks, OpCore.settle): R_AUTO, written from Python
# before the block's first op is begun, 1 when its proxy may start in the kernels where the block
# before it ends (its first op's O_GATE is then 2); R_ADONE the proxies the kernels completed so
# since Python last looked, R_ASTART when the last one chained started its successor
R_AUTO, R_ADONE, R_ASTART = R_CBY + 1, R_CBY + 2, R_CBY + 3
R_FIELDS = R_CBY + 4
# per op
O_KIND, O_VAL, O_STATE, O_DEPS, O_TSTART, O_NEXT, O_LAST, O_GATE, O_RI, O_NDEP, O_LOST, O_DEP0 = range(12)
# a compute-stream op's dependents are the tensor collectives launched after it before the next one
# (at most MAX_WAITS: OpCore._template), a collective's the compute op that waits for it; 16 fields,
# two cache lines (OpCore aligns the table), the fields every event reads in the first
MAX_DEPS = MAX_WAITS
O_FIELDS = O_DEP0 + MAX_DEPS
assert O_FIELDS == 16 and O_GATE < 8
K_C, K_M, K_A, K_F = 0, 1, 2, 3  # compute, collective, alloc, free (the last two instant: Shard._instant)
# a pipeline send (p2p.PointToPoint._start_send): ``O_VAL`` its bytes, ``O_LOST`` its descriptor, a row
# of ``sd``: (destination, tag, route id of the message core, counter, stream slot); its counter
# ``kc[counter]`` is the rank's p2p_send count for (destination, tag)
K_S = 4
# a pipeline receive (p2p.PointToPoint._start_recv): ``O_VAL`` its bytes, ``O_LOST`` its descriptor
# (SD_DST its source, SD_RID unused), ``kc`` the rank's p2p_recv count for (source, tag)
K_R = 5
SD_DST, SD_TAG, SD_RID, SD_CTR, SD_SLOT, SD_RECV = range(6)
SD_FIELDS = 6
S_DONE, S_LAUNCHED, S_STARTED = 0, 1, 2  # a free slot is a done op: zeroed arrays start free
I_C, I_M, I_W, I_A, I_F = 0, 1, 2, 3, 4
# plans
P_DUR, P_MSGB, P_MSGS, P_MEMBERS, P_LPTR, P_LLEN, P_CALLS, P_MAXWAIT, P_CNS, P_CCOUNT, P_ARRIVALS, P_GROUP, P_SIG = (
    range(13))  # fmt: skip
P_FIELDS = 13
# the open call of a tensor group whose members arrive one by one (unfolded: collective_run._rendezvous):
# ``gr[group, GR_N]`` members arrived, ``GR_SIG`` the first one's signature, then (rank index, op) pairs
# in arrival order; a group has at most one open call (a member's next call waits behind this one)
MAX_MEMBERS = 64
GR_N, GR_SIG, GR_MEM0 = 0, 1, 2
GR_FIELDS = GR_MEM0 + 2 * MAX_MEMBERS
# globals
(G_HEAPN, G_EVENTS, G_STATUS, G_RET_RI, G_RET_T, G_RET_TSTART, G_RET_OP, G_RING, G_MAXAHEAD, G_BUCKET, G_NOVF,
 G_ERR) = range(12)  # fmt: skip
# G_SENT: a send was put in the message core's heap (OpCore refreshes NetCore.top); G_LOW: the message
# core's arrays have less room than a call may take (NET_LOW messages: OpCore grows them); G_SS: the
# stream slot of an ST_SDRAIN
# G_NET: 1 when the message core's table is a real one (OpCore.attach_net; not in warm_up or the tests)
G_SENT, G_LOW, G_SS, G_NET = 12, 13, 14, 15
# G_RDRAIN: 1 + the slot of a sealed receive stream whose last kernel receive completed inside a
# call (G_RDRAIN_RI its rank index): Python starts its ops behind it first (OpCore.drained)
G_RDRAIN, G_RDRAIN_RI, G_RDRAIN_T = 16, 17, 18
# G_PREL: a receive the block's end started completed at once and released the next block's first op
# (its proxy would start among the ended block's dependents: OpCore.instant_stop starts it before the
# program's check)
G_PREL = 19
G_FIELDS = 20
# a kernel call starts at most MAX_DEPS + 1 sends outside the event loop, and an event as many: the
# loop stops (ST_LIMIT, G_LOW) before an event with less room than NET_EVENT messages, and every call
# leaves G_LOW when less than NET_LOW are left (OpCore grows the core's arrays before the next call)
NET_EVENT, NET_LOW = 8, 16
NO_LIMIT = 1 << 62  # netkernels.NO_LIMIT: no key limit
# a heap row's key: ``rank << SEQ_BITS | seq`` orders as ``(rank, seq)`` while rank < 2^RANK_BITS
# (8,388,608 GPUs: OpCore checks the world size) and seq < 2^SEQ_BITS (10^12 events of one rank:
# _push checks, G_ERR 3), one comparison after the time instead of two
SEQ_BITS = 40
RANK_BITS = 63 - SEQ_BITS
SEQ_LIMIT = 1 << SEQ_BITS
SEQ_MASK = SEQ_LIMIT - 1
# statuses
ST_LIMIT, ST_BLOCK_DONE, ST_RESUME, ST_SUSPEND, ST_LAUNCHED = range(5)
# where an instant op (alloc, free) stopped the compute stream's loop (Shard._try_start's ``while``)
# half way, Python's turn before the loop goes on (OpCore.instant_stop): the program resumes
# (ST_IRESUME: then ``cont`` goes on with the loop), the block's last op was instant (ST_IBLOCK: the
# proxy completes, the shard's compute stream goes on), or an alloc passed the capacity (ST_OOM)
ST_IRESUME, ST_IBLOCK, ST_OOM = 5, 6, 7
# the last send of a sealed send stream completed (G_SS its slot): Python's ops behind it go on
ST_SDRAIN = 8
# a receive met a message of another size when it started (G_RET_RI, G_RET_OP, G_RET_T; G_RET_TSTART
# the message's bytes): Python raises the receive's error (p2p.PointToPoint._check_recv)
ST_RMISMATCH = 9
# launch_step launched a tape step's block, its send and the next step's receive (not a stop of run())
ST_STEPPED = 10
# (inside the kernels only: an instant op ended its block and the next block started behind it,
# _instant's chain - the compute stream's loop goes on with that block's first op)
ST_ICHAIN = 11
# The packed buffers (OpCore._pack_*): numba's dispatcher checks and unboxes each array argument of
# a call, about 0.15 us apiece (2.6 us a call with the 14 arrays these kernels use), and a run makes
# a kernel call every two or three events; so the entry points below take five buffers and cut the
# arrays out of them. ``ib`` (int64, fixed size) and ``gb`` (int64, grown: the templates, plans and
# timeline) start with a header of ``(offset, rows)`` pairs, ``fb`` (float64, fixed) is laid out by
# ``ib``'s header; ``tf`` (the templates' FLOPs) and ``free`` (the link model's array) are passed whole.
H_RS, H_OPS, H_HEAP, H_G, H_QN, H_QM, H_OVF, H_GR, H_OF, H_RF = range(0, 20, 2)
IB_HEADER = 20
H_TI, H_TP, H_PL, H_PLK, H_TL, H_SD, H_KC = range(0, 14, 2)
GB_HEADER = 14


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
    key = (rank << SEQ_BITS) | seq
    i = g[G_HEAPN]
    g[G_HEAPN] = i + 1
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
    n = g[G_HEAPN] - 1
    g[G_HEAPN] = n
    t, key, op = heap[n, 0], heap[n, 1], heap[n, 2]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        ct, ck = heap[c, 0], heap[c, 1]
        if c + 1 < n:
            dt, dk = heap[c + 1, 0], heap[c + 1, 1]
            if dt < ct or (dt == ct and dk < ck):
                c += 1
                ct, ck = dt, dk
        if ct < t or (ct == t and ck < key):
            heap[i, 0], heap[i, 1], heap[i, 2] = ct, ck, heap[c, 2]
            i = c
        else:
            break
    heap[i, 0], heap[i, 1], heap[i, 2] = t, key, op


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


@njit(cache=True, inline="always")
def _timeline(tl, ovf, g, size, count, t, t_end):
    """ShardStats.timeline_add on tier 0 (the same integer shares; tests/emulator/engine/
    test_opcore.py holds the two equal); slots past the array go to the overflow rows, which the
    shard adds with ShardStats.timeline_add itself."""
    if size == 0 or count == 0:  # (not size * count: it can wrap to 0 in int64)
        return
    bucket = g[G_BUCKET]
    slot = t // bucket
    last = slot if t_end <= t else (t_end - 1) // bucket
    # past the array, or a transfer over 2^48 bytes (256 TiB: its products, or a bucket's sum of them,
    # could pass int64, where Python's integers have no bound): the shard adds it
    if last >= tl.shape[0] or size >= (1 << 48) // count or (t_end > t and size >= (1 << 62) // (t_end - t)):
        k = g[G_NOVF]
        if k >= ovf.shape[0]:
            g[G_ERR] = 1
            return
        ovf[k, 0], ovf[k, 1], ovf[k, 2], ovf[k, 3] = size, count, t, t_end
        g[G_NOVF] = k + 1
        return
    if last == slot:
        tl[slot] += size * count
        return
    done = 0
    for s in range(slot, last + 1):
        end = (s + 1) * bucket
        if t_end < end:
            end = t_end
        part = size * (end - t) // (t_end - t) - done
        tl[s] += part * count
        done += part


@njit(cache=True)
def _start_at(P, ri, op, t):
    """Shard._try_start for a head op whose dependencies are done (compute, or closed form)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    pl = _i2(P, A_PL, P_FIELDS)
    plk = _i1(P, A_PLK)
    free = _i1(P, A_FREE)
    qn = _i1(P, A_QN)
    qm = _i1(P, A_QM)
    tl = carray(_void_ptr(P[A_TL]), P[A_NTL], np.int64)
    ovf = carray(_void_ptr(P[A_OVF]), (P[A_NOVF], 4), np.int64)
    heap = _i2(P, A_HEAP, 3)
    g = _i1(P, A_G)
    gr = _i2(P, A_GR, GR_FIELDS)
    ops[op, O_STATE] = S_STARTED
    ops[op, O_TSTART] = t
    if ops[op, O_KIND] == K_C:
        seq = rs[ri, R_SEQ] + 1
        rs[ri, R_SEQ] = seq
        _push(heap, g, t + ops[op, O_VAL], rs[ri, R_RANK], seq, op)
        return
    # collective_run._rendezvous: the call completes when its last member arrives (at once when one
    # member stands for the group); until then an arrival takes no event key
    p = ops[op, O_VAL]
    arrivals = pl[p, P_ARRIVALS]
    gi = pl[p, P_GROUP]
    if arrivals > 1:
        n = gr[gi, GR_N]
        if n == 0:
            gr[gi, GR_SIG] = pl[p, P_SIG]
        elif gr[gi, GR_SIG] != pl[p, P_SIG]:
            g[G_ERR] = 2  # the members' calls differ (the built-in workload never does this)
            return
        gr[gi, GR_MEM0 + 2 * n] = ri
        gr[gi, GR_MEM0 + 2 * n + 1] = op
        gr[gi, GR_N] = n + 1
        if n + 1 < arrivals:
            return
        gr[gi, GR_N] = 0
    # LinkModel.hold: the ports held together from when all are free
    lo, ln = pl[p, P_LPTR], pl[p, P_LLEN]
    start = t
    blocker = -1
    for i in range(lo, lo + ln):
        link = plk[i]
        if free[link] > start:
            start = free[link]
            blocker = link
    end = start + pl[p, P_DUR]
    if blocker >= 0:
        qn[blocker] += (start - t) * pl[p, P_MEMBERS]
        qm[blocker] += pl[p, P_MEMBERS]
    for i in range(lo, lo + ln):
        free[plk[i]] = end
    pl[p, P_CALLS] += 1
    if start - t > pl[p, P_MAXWAIT]:
        pl[p, P_MAXWAIT] = start - t
    _timeline(tl, ovf, g, pl[p, P_MSGB], pl[p, P_MSGS], start, end)
    if arrivals == 1:  # folded: the one member (the common case, without the table)
        pl[p, P_CNS] += end - t  # NetCore.note_collective (live figures)
        pl[p, P_CCOUNT] += 1
        seq = rs[ri, R_SEQ] + 1
        rs[ri, R_SEQ] = seq
        _push(heap, g, end, rs[ri, R_RANK], seq, op)
        return
    # every member's completion, in arrival order, each key's seq taken now from its rank's counter
    for i in range(arrivals):
        mri = gr[gi, GR_MEM0 + 2 * i]
        mop = gr[gi, GR_MEM0 + 2 * i + 1]
        mp = ops[mop, O_VAL]
        pl[mp, P_CNS] += end - ops[mop, O_TSTART]  # NetCore.note_collective (live figures)
        pl[mp, P_CCOUNT] += 1
        seq = rs[mri, R_SEQ] + 1
        rs[mri, R_SEQ] = seq
        _push(heap, g, end, rs[mri, R_RANK], seq, mop)


@njit(cache=True)
def _start(rs, ops, of, pl, plk, free, qn, qm, tl, ovf, heap, g, gr, ri, op, t):
    """_start_at over arrays (tests/emulator/engine/test_opcore_fuzz.py calls the rule this way)."""
    # (no template is read: ti, tf, tp and rf stand in by arrays never indexed)
    P = _table(rs, ops, of, of, rs, of, rs, pl, plk, free, qn, qm, tl, ovf, heap, g, gr)
    _start_at(P + (P[A_RS], P[A_RS], P[A_RS]), ri, op, t)


@njit(cache=True)
def _try_c(P, ri, t):
    """Shard._try_start on the rank's compute stream (its block ops): a compute op starts, instant
    ops (alloc, free) run and complete at ``t`` and the loop goes on with the next; returns ST_LIMIT,
    or an instant op's ST_IRESUME, ST_IBLOCK or ST_OOM (Python's turn: OpCore.instant_stop)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    while True:
        op = rs[ri, R_CHEAD]
        if op < 0 or ops[op, O_STATE] != S_LAUNCHED or ops[op, O_GATE]:
            return ST_LIMIT  # empty, running, or a block's first op whose proxy has not started (Python's)
        if ops[op, O_DEPS]:
            if rs[ri, R_CBLK] < 0:
                rs[ri, R_CBLK] = t
            return ST_LIMIT
        if rs[ri, R_CBLK] >= 0:
            by = rs[ri, R_CBY]
            if by:  # a block's first op, released by a tape's receive (_recv_done)
                base = R_SS0 + (by - 1) * SS_FIELDS
                rs[ri, base + SS_CWAIT] += t - rs[ri, R_CBLK]
                rs[ri, base + SS_CHIT] = 1
            else:
                rs[ri, R_WCT] += t - rs[ri, R_CBLK]  # blocked by the tensor stream
                rs[ri, R_WCT_HIT] = 1
            rs[ri, R_CBLK] = -1
        if ops[op, O_KIND] == K_C:
            _start_at(P, ri, op, t)
            return ST_LIMIT
        status = _instant(P, ri, op, t)
        if status != ST_LIMIT and status != ST_ICHAIN:
            return status


@njit(cache=True)
def _instant(P, ri, op, t):
    """Shard._instant then Shard._complete(start_next=False) for an alloc or free at the head of
    the compute stream; ST_LIMIT when the stream's loop goes on."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    g = _i1(P, A_G)
    ops[op, O_STATE] = S_DONE
    _forget(rs, ri, op)
    ops[op, O_TSTART] = t
    if ops[op, O_KIND] == K_A:
        used = rs[ri, R_MEM] + ops[op, O_VAL]
        rs[ri, R_MEM] = used
        if used > rs[ri, R_CAP]:
            g[G_RET_RI] = ri
            g[G_RET_T] = t
            g[G_RET_OP] = op
            return ST_OOM
        if used > rs[ri, R_PEAK]:
            rs[ri, R_PEAK] = used
    else:
        rs[ri, R_MEM] -= ops[op, O_VAL]
    nxt = ops[op, O_NEXT]
    rs[ri, R_CHEAD] = nxt
    if nxt < 0:
        rs[ri, R_CTAIL] = -1
    if ops[op, O_LAST]:
        # the block's last op: the shard completes its proxy (counters, dependents, the program);
        # kernel sends and receives first
        if ops[op, O_NDEP] and _release_sends(P, ri, op, t) == ST_RMISMATCH:
            return ST_RMISMATCH
        if nxt < 0 and rs[ri, R_BEGIN] >= 0 and rs[ri, R_AUTO]:
            _begin_pending(P, ri)  # (start_block's first step: the next block's first op, queued now)
            nxt = rs[ri, R_CHEAD]
        if nxt >= 0 and ops[nxt, O_GATE] == 2:
            # its proxy completes (a BLOCK: OpCore.instant_stop's Shard._complete) and the next
            # one starts, here, where the Python rules would start it before the program's check
            # (a receive the end released that completed at once: G_PREL) or after a check that
            # does not resume it (else ST_IBLOCK: Python resumes the program first)
            out = rs[ri, R_OUT] - 1
            if g[G_PREL] or not (rs[ri, R_SUSP] and (rs[ri, R_SYNC] or out <= g[G_MAXAHEAD] >> 1)):
                g[G_PREL] = 0
                rs[ri, R_OUT] = out
                rs[ri, R_OPSDONE] += 1
                if t > rs[ri, R_LAST]:
                    rs[ri, R_LAST] = t
                rs[ri, R_ADONE] += 1
                rs[ri, R_ASTART] = t
                ops[nxt, O_GATE] = 0
                return ST_ICHAIN
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        g[G_RET_OP] = op
        return ST_IBLOCK
    rs[ri, R_OUT] -= 1
    rs[ri, R_OPSDONE] += 1
    if t > rs[ri, R_LAST]:
        rs[ri, R_LAST] = t
    # a tensor collective launched after it waits for it (Shard.launch: the compute stream's last op)
    for k in range(ops[op, O_NDEP]):
        dep = ops[op, O_DEP0 + k]
        ops[dep, O_DEPS] -= 1
        if ops[dep, O_DEPS] == 0 and rs[ri, R_THEAD] == dep:
            _try_t(P, rs, ops, ri, t)
    ops[op, O_NDEP] = 0
    if rs[ri, R_SUSP] and not rs[ri, R_SYNC] and rs[ri, R_OUT] <= g[G_MAXAHEAD] >> 1:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        return ST_IRESUME
    return ST_LIMIT


@njit(cache=True, inline="always")
def _try_t(P, rs, ops, ri, t):
    """Shard._try_start on the rank's tensor stream."""
    op = rs[ri, R_THEAD]
    if op < 0 or ops[op, O_STATE] != S_LAUNCHED:
        return
    if ops[op, O_DEPS]:
        if rs[ri, R_TBLK] < 0:
            rs[ri, R_TBLK] = t
        return
    if rs[ri, R_TBLK] >= 0:
        rs[ri, R_WTC] += t - rs[ri, R_TBLK]  # blocked by the compute stream
        rs[ri, R_WTC_HIT] = 1
        rs[ri, R_TBLK] = -1
    _start_at(P, ri, op, t)


@njit(cache=True)
def _start_block(P, ri, t):
    """The block's proxy started (its dependencies are done): its first compute op starts."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    g = _i1(P, A_G)
    op = rs[ri, R_CHEAD]
    if op >= 0:  # (always: the block's first op; a view has no rows to wrap a -1 around)
        ops[op, O_GATE] = 0
    g[G_STATUS] = _try_c(P, ri, t)


@njit(cache=True)
def _begin_block(P, ri, b):
    """Queue block ``b``'s first compute op on the rank's compute stream, gated by its proxy (the
    Python op that stands for it on the shard's compute stream); returns it."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    of = _f1(P, A_OF)
    ti = _i2(P, A_TI, 3)
    tf = _f1(P, A_TF)
    tp = _i2(P, A_TP, 2)
    g = _i1(P, A_G)
    row = tp[b, 0]
    code = ti[row, 0]
    op = _new_op(rs, ops, g, ri, K_C if code == I_C else (K_A if code == I_A else K_F), ti[row, 1])
    of[op] = tf[row]
    ops[op, O_LOST] = ti[row, 2]
    ops[op, O_GATE] = 1 + rs[ri, R_AUTO]  # (2: its proxy may start in the kernels, _complete)
    rs[ri, R_AUTO] = 0
    ops[op, O_LAST] = 1 if tp[b, 1] == 1 else 0
    if rs[ri, R_CTAIL] >= 0:
        ops[rs[ri, R_CTAIL], O_NEXT] = op
    else:
        rs[ri, R_CHEAD] = op
    rs[ri, R_CTAIL] = op
    rs[ri, R_LASTC] = op
    rs[ri, R_BT] = b
    rs[ri, R_BPOS] = 1
    rs[ri, R_PEND] = -1
    rs[ri, R_NWAIT] = 0
    recv = rs[ri, R_RPEND]
    if recv >= 0:  # (tape.py's phase 1: the proxy's wait for the step's receive, Op.wait on "compute")
        rs[ri, R_RPEND] = -1
        if ops[recv, O_STATE] != S_DONE:
            _add_dep(ops, g, op, recv)
    g[G_RET_OP] = op


@njit(cache=True, inline="always")
def _queue_c(rs, ops, ri, op):
    """Shard.launch's queueing of a block op on the rank's compute stream (a compute op, an alloc
    or a free): the stream's tail, the last compute-stream op the next collective waits for, and
    the rank's outstanding count (inlined: the launch loop's hot path)."""
    if rs[ri, R_CTAIL] >= 0 and rs[ri, R_CHEAD] >= 0:
        ops[rs[ri, R_CTAIL], O_NEXT] = op
    else:
        rs[ri, R_CHEAD] = op
    rs[ri, R_CTAIL] = op
    rs[ri, R_LASTC] = op
    rs[ri, R_OUT] += 1


@njit(cache=True)
def _launch_rest(P, ri, now):
    """tensor_parallel.launch_prepared for the rest of the block: each op launched as Shard.launch
    does; ST_SUSPEND when the program must suspend (call again after it resumed)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    of = _f1(P, A_OF)
    ti = _i2(P, A_TI, 3)
    tf = _f1(P, A_TF)
    tp = _i2(P, A_TP, 2)
    g = _i1(P, A_G)
    b = rs[ri, R_BT]
    row0, n = tp[b, 0], tp[b, 1]
    max_ahead = g[G_MAXAHEAD]
    while rs[ri, R_BPOS] < n:
        pos = rs[ri, R_BPOS]
        rs[ri, R_BPOS] = pos + 1
        row = row0 + pos
        code = ti[row, 0]
        if code == I_W:
            pend = rs[ri, R_PEND]
            if pend >= 0:
                if ops[pend, O_STATE] != S_DONE:
                    k = rs[ri, R_NWAIT]
                    rs[ri, R_WAIT0 + k] = pend
                    rs[ri, R_NWAIT] = k + 1
                rs[ri, R_PEND] = -1
            continue
        if code == I_A or code == I_F:
            # Shard.launch of an alloc or free on the compute stream (no dependencies: OpCore._template
            # takes none where a wait is owed); it runs at once when it is the stream's head
            op = _new_op(rs, ops, g, ri, K_A if code == I_A else K_F, ti[row, 1])
            ops[op, O_LOST] = ti[row, 2]
            if pos == n - 1:
                ops[op, O_LAST] = 1
            _queue_c(rs, ops, ri, op)
            if rs[ri, R_CHEAD] == op:
                status = _try_c(P, ri, now)
                if status != ST_LIMIT:  # (the program runs: never ST_IRESUME here)
                    g[G_STATUS] = status
                    return
        elif code == I_C:
            op = _new_op(rs, ops, g, ri, K_C, ti[row, 1])
            of[op] = tf[row]
            ops[op, O_LOST] = ti[row, 2]
            if pos == n - 1:
                ops[op, O_LAST] = 1
            for k in range(rs[ri, R_NWAIT]):
                dep = rs[ri, R_WAIT0 + k]
                if dep >= 0 and ops[dep, O_STATE] != S_DONE:
                    _add_dep(ops, g, op, dep)
            rs[ri, R_NWAIT] = 0
            _queue_c(rs, ops, ri, op)
            if rs[ri, R_CHEAD] == op:
                _try_c(P, ri, now)
        else:
            op = _new_op(rs, ops, g, ri, K_M, ti[row, 1])
            last = rs[ri, R_LASTC]
            if last >= 0 and ops[last, O_STATE] != S_DONE:
                _add_dep(ops, g, op, last)
            if rs[ri, R_TTAIL] >= 0 and rs[ri, R_THEAD] >= 0:
                ops[rs[ri, R_TTAIL], O_NEXT] = op
            else:
                rs[ri, R_THEAD] = op
            rs[ri, R_TTAIL] = op
            rs[ri, R_OUT] += 1
            if rs[ri, R_THEAD] == op:
                _try_t(P, rs, ops, ri, now)
            if ti[row, 2]:
                rs[ri, R_PEND] = op  # overlapped: waited for at the next I_W
            elif ops[op, O_STATE] != S_DONE:
                k = rs[ri, R_NWAIT]
                rs[ri, R_WAIT0 + k] = op
                rs[ri, R_NWAIT] = k + 1
        if rs[ri, R_OUT] >= max_ahead and not rs[ri, R_SUSP]:
            g[G_STATUS] = ST_SUSPEND
            return
    g[G_STATUS] = ST_LAUNCHED


@njit(cache=True, inline="always")
def _complete(P, rs, ops, of, rf, g, ri, op, t):
    """Shard._complete for a block op; returns a status when Python must act."""
    ops[op, O_STATE] = S_DONE
    _forget(rs, ri, op)
    kind = ops[op, O_KIND]
    # pop the stream's head (it is this op)
    if kind == K_C:
        nxt = ops[op, O_NEXT]
        rs[ri, R_CHEAD] = nxt
        if nxt < 0:
            rs[ri, R_CTAIL] = -1
    else:
        nxt = ops[op, O_NEXT]
        rs[ri, R_THEAD] = nxt
        if nxt < 0:
            rs[ri, R_TTAIL] = -1
    if ops[op, O_LAST]:
        # the block's last compute op: the shard completes its proxy (counters, dependents, the
        # compute stream's next op, the program) with this op's figures; kernel sends and receives first
        if ops[op, O_NDEP] and _release_sends(P, ri, op, t) == ST_RMISMATCH:
            return ST_RMISMATCH
        if nxt < 0 and rs[ri, R_BEGIN] >= 0 and rs[ri, R_AUTO]:
            _begin_pending(P, ri)  # (start_block's first step: the next block's first op, queued now)
            nxt = rs[ri, R_CHEAD]
        if nxt >= 0 and ops[nxt, O_GATE] == 2:
            return _chain(P, ri, op, nxt, t)
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        g[G_RET_TSTART] = ops[op, O_TSTART]
        g[G_RET_OP] = op
        return ST_BLOCK_DONE
    rs[ri, R_OUT] -= 1
    rs[ri, R_OPSDONE] += 1
    if t > rs[ri, R_LAST]:
        rs[ri, R_LAST] = t
    if kind == K_C:
        rs[ri, R_CNS] += t - ops[op, O_TSTART]
        rs[ri, R_LOST] += ops[op, O_LOST]
        rf[ri] += of[op]
    else:
        rs[ri, R_COMMNS] += t - ops[op, O_TSTART]
    for k in range(ops[op, O_NDEP]):
        dep = ops[op, O_DEP0 + k]
        ops[dep, O_DEPS] -= 1
        if ops[dep, O_DEPS] == 0:
            if ops[dep, O_KIND] == K_C:
                # a compute op (alloc and free have no dependencies): it starts, no instant op runs
                rs[ri, R_CBY] = 0
                if rs[ri, R_CHEAD] == dep:
                    _try_c(P, ri, t)
            elif rs[ri, R_THEAD] == dep:
                _try_t(P, rs, ops, ri, t)
    ops[op, O_NDEP] = 0
    if kind == K_C:
        status = _try_c(P, ri, t)
        if status != ST_LIMIT:
            # an instant op stopped the loop: Python goes on with it, then makes this op's check
            # below (OpCore.instant_stop)
            return status
    else:
        _try_t(P, rs, ops, ri, t)
    if rs[ri, R_SUSP] and not rs[ri, R_SYNC] and rs[ri, R_OUT] <= g[G_MAXAHEAD] >> 1:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        return ST_RESUME
    return ST_LIMIT


@njit(cache=True)
def _chain(P, ri, op, nxt, t):
    """The block's last compute op ``op`` done at ``t`` and the next block's first op ``nxt`` is
    the compute stream's next, its proxy waiting for nothing of Python's (O_GATE 2: Shard's
    _launch_block_compiled): what Shard._complete does for the proxy (the counts of a compute
    op, its FLOPs; no dependents, no trace, no lost time: the conditions of O_GATE 2) and its
    _try_start of the next proxy (start_block: its first op ungated, the stream's loop), then
    _complete's check of the program - here, with no stop; Python takes the proxies' own fields
    where it next reads them (OpCore.settle: R_ADONE, R_ASTART)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    of = _f1(P, A_OF)
    rf = _f1(P, A_RF)
    g = _i1(P, A_G)
    rs[ri, R_OUT] -= 1
    rs[ri, R_OPSDONE] += 1
    if t > rs[ri, R_LAST]:
        rs[ri, R_LAST] = t
    rs[ri, R_CNS] += t - ops[op, O_TSTART]
    rf[ri] += of[op]
    rs[ri, R_ADONE] += 1
    rs[ri, R_ASTART] = t
    g[G_PREL] = 0  # (as OpCore.block_done: the next op starts before the program's check)
    ops[nxt, O_GATE] = 0
    status = _try_c(P, ri, t)
    if status != ST_LIMIT:
        return status  # an instant op of the next block: Python goes on (OpCore.stopped), then the check
    if rs[ri, R_SUSP] and not rs[ri, R_SYNC] and rs[ri, R_OUT] <= g[G_MAXAHEAD] >> 1:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        return ST_RESUME
    return ST_LIMIT


@njit(cache=True, inline="always")
def _net(P):
    """The message core's table (netkernels.TABLE) as an array."""
    return carray(_void_ptr(P[A_NET]), _NET_COLS, np.int64)


@njit(cache=True, inline="always")
def _net_room(P):
    """How many more messages the message core's arrays take (those a send fills)."""
    pn = _net(P)
    st = carray(_void_ptr(pn[3 * T_ST]), pn[3 * T_ST + 1], np.int64)
    room = pn[3 * T_HEAP + 1] - st[HEAP_N]
    room = min(room, pn[3 * T_MSG + 1] - st[MSG_N])
    room = min(room, pn[3 * T_OUTB + 1] - st[OUT_N])
    room = min(room, pn[3 * T_HTK + 1] // 2 - st[HT_FILL])  # (a receive that waits takes a row)
    return min(room, pn[3 * T_PEND + 1] - st[PEND_N])


@njit(cache=True)
def _note_room(P):
    """G_LOW when the next call could lack room for its sends (only where the kernels send)."""
    g = _i1(P, A_G)
    if g[G_NET] and _net_room(P) < NET_LOW:
        g[G_LOW] = 1


@njit(cache=True)
def _head_starts(rs, ops, ri, base, t):
    """Shard._try_start's rules shared by a kernel send and receive stream (its slot's fields from
    ``base``): its head op starts at ``t`` (returned) where it is launched and waits for nothing,
    the time its stream was blocked by the compute stream counted; -1 where none starts (a
    waiting head marks when its stream became blocked)."""
    op = rs[ri, base + SS_HEAD]
    if op < 0 or ops[op, O_STATE] != S_LAUNCHED:
        return -1
    if ops[op, O_DEPS]:
        if rs[ri, base + SS_BLK] < 0:
            rs[ri, base + SS_BLK] = t
        return -1
    if rs[ri, base + SS_BLK] >= 0:
        rs[ri, base + SS_WAIT] += t - rs[ri, base + SS_BLK]  # blocked by the compute stream
        rs[ri, base + SS_HIT] = 1
        rs[ri, base + SS_BLK] = -1
    ops[op, O_STATE] = S_STARTED
    ops[op, O_TSTART] = t
    return op


@njit(cache=True)
def _try_s(P, ri, base, t):
    """Shard._try_start on a kernel send stream (its slot's fields from ``base``): its head send
    starts when its dependency (the compute stream's block) is done: p2p.PointToPoint._start_send,
    its message put on the up-links by the message core's rules (netkernels.send_message), its
    completion an event of this heap at the tail's leaving, keyed from the rank's counter."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    op = _head_starts(rs, ops, ri, base, t)
    if op < 0:
        return
    sd = _i2(P, A_SD, SD_FIELDS)
    kc = _i1(P, A_KC)
    g = _i1(P, A_G)
    d = ops[op, O_LOST]
    c = sd[d, SD_CTR]
    k = kc[c]
    kc[c] = k + 1
    src = rs[ri, R_RANK]
    pn = _net(P)
    (st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
     tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, pseq, pidx, px) = _views(pn)  # fmt: skip
    # (netkernels.send_message without its room check: OpCore keeps the room, G_LOW)
    size = ops[op, O_VAL]
    px[0, X_PEER] = sd[d, SD_DST]
    px[0, X_SIZE] = size
    px[0, X_CHAN] = 0
    px[0, X_RID] = sd[d, SD_RID]
    end_up = _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat, tstat, khist, tl, pend,
                     rank_shard, mseq, outb, px, 0, src, 0, sd[d, SD_TAG], k, size, 0, SEND_KIND, t)  # fmt: skip
    _set_top(st, heap)
    g[G_SENT] = 1
    heap_o = _i2(P, A_HEAP, 3)
    seq = rs[ri, R_SEQ] + 1
    rs[ri, R_SEQ] = seq
    _push(heap_o, g, end_up, src, seq, op)


@njit(cache=True)
def _try_r(P, ri, base, t):
    """Shard._try_start on a kernel receive stream: its head receive starts when its dependency (the
    compute stream's block) is done - p2p.PointToPoint._start_recv with the message core's rules
    (netkernels.start_receive): a message in the mailbox completes it at its delivery (an event of
    this heap, or at once: then the loop goes on), else it waits in the core's table for the
    hand-over (netkernels._handover completes it: RECV_DONE, then complete_recv). ST_RMISMATCH
    for a message of another size; a completion at once releases only gated ops (its block's
    first op: the proxy starts later), so it makes no other status."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    kc = _i1(P, A_KC)
    g = _i1(P, A_G)
    while True:
        op = _head_starts(rs, ops, ri, base, t)
        if op < 0:
            return ST_LIMIT
        d = ops[op, O_LOST]
        c = sd[d, SD_CTR]
        k = kc[c]
        kc[c] = k + 1
        rank = rs[ri, R_RANK]
        src, tag, size = sd[d, SD_DST], sd[d, SD_TAG], ops[op, O_VAL]
        pn = _net(P)
        (st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
         tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, pseq, pidx, px) = _views(pn)  # fmt: skip
        i = _ht_find(htk, hts, HT_MSG, rank, 0, tag, 0, src, k)
        if i < 0:
            j = _ht_insert(htk, hts, st, HT_RECV, rank, 0, tag, 0, src, k)
            htv[j, 0] = -2 - op  # (a kernel receive: netcore's ids are >= 0)
            htv[j, 1] = size
            htv[j, 2] = t
            return ST_LIMIT
        delivery, got = htv[i, 0], htv[i, 1]
        _ht_delete(htk, htv, hts, st, i)
        if got != size:
            g[G_RET_RI] = ri
            g[G_RET_OP] = op
            g[G_RET_T] = t
            g[G_RET_TSTART] = got
            return ST_RMISMATCH
        if delivery > t:
            heap_o = _i2(P, A_HEAP, 3)
            seq = rs[ri, R_SEQ] + 1
            rs[ri, R_SEQ] = seq
            _push(heap_o, g, delivery, rank, seq, op)
            return ST_LIMIT
        dep = _recv_done(P, ri, op, t)
        if dep >= 0 and not ops[dep, O_GATE]:
            g[G_ERR] = 5  # a receive at once released more than a gated op (an engine bug)
            return ST_LIMIT
        if dep != -1:
            g[G_PREL] = 1


@njit(cache=True)
def _message_done(rs, ops, ri, op, t, base):
    """Shard._complete's own rules for a kernel send or receive ``op`` done at ``t`` on the stream
    slot at ``base``: done, off its stream's head (its next op returned, -1 when none), the rank's
    counts (outstanding, ops done, last time, communication time)."""
    ops[op, O_STATE] = S_DONE
    nxt = ops[op, O_NEXT]
    rs[ri, base + SS_HEAD] = nxt
    if nxt < 0:
        rs[ri, base + SS_TAIL] = -1
    rs[ri, R_OUT] -= 1
    rs[ri, R_OPSDONE] += 1
    if t > rs[ri, R_LAST]:
        rs[ri, R_LAST] = t
    rs[ri, R_COMMNS] += t - ops[op, O_TSTART]
    return nxt


@njit(cache=True)
def _recv_done(P, ri, op, t):
    """Shard._complete of a kernel receive up to its stream's next op: its counts, its dependents
    (the block it was launched for: its first op, whose release names the receive's stream, R_CBY);
    returns that op when it is released at the compute stream's head (the caller starts it with
    _try_c: not called here, numba's cache cannot load mutually recursive kernels and _try_c reaches
    _try_r), -2 when the block launched for it has not begun (its proxy waited for it alone), else
    -1. A sealed stream left empty: G_RDRAIN (Python's ops behind it first)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    g = _i1(P, A_G)
    start = -1
    if rs[ri, R_RPEND] == op:
        rs[ri, R_RPEND] = -1
        if rs[ri, R_BEGIN] >= 0:
            start = -2  # the block launched for it is not begun yet: its proxy waited for it alone
    slot = sd[ops[op, O_LOST], SD_SLOT]
    base = R_SS0 + slot * SS_FIELDS
    nxt = _message_done(rs, ops, ri, op, t, base)
    for k in range(ops[op, O_NDEP]):
        dep = ops[op, O_DEP0 + k]
        ops[dep, O_DEPS] -= 1
        if ops[dep, O_DEPS] == 0:
            rs[ri, R_CBY] = 1 + slot
            if rs[ri, R_CHEAD] == dep:
                start = dep
    ops[op, O_NDEP] = 0
    if nxt < 0 and rs[ri, base + SS_SEAL]:
        g[G_RDRAIN] = 1 + slot
        g[G_RDRAIN_RI] = ri
        g[G_RDRAIN_T] = t
    return start


@njit(cache=True)
def _recv_rest(P, ri, op, t, status):
    """The rest of a kernel receive's completion after its dependents (``status``: theirs): its
    stream's next ops (the Python rules would start them after the dependents' own rules, which
    only an instant op's stop leaves to Python: the next receive waits for a later block), then the
    program's check (ST_RESUME), unless Python goes on with ``status``."""
    rs = _i2(P, A_RS, R_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    g = _i1(P, A_G)
    base = R_SS0 + sd[_i2(P, A_OPS, O_FIELDS)[op, O_LOST], SD_SLOT] * SS_FIELDS
    if rs[ri, base + SS_HEAD] >= 0:
        st2 = _try_r(P, ri, base, t)
        if st2 != ST_LIMIT:
            return st2
    if status != ST_LIMIT:
        return status
    if rs[ri, R_SUSP] and not rs[ri, R_SYNC] and rs[ri, R_OUT] <= g[G_MAXAHEAD] >> 1:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        return ST_RESUME
    return ST_LIMIT


@njit(cache=True)
def _release_sends(P, ri, op, t):
    """The block's last op ``op`` is done: the sends launched after it (its dependents) go on, as
    the dependents of its proxy would (Shard._complete: before the shard's own rules for the proxy)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    g = _i1(P, A_G)
    n = ops[op, O_NDEP]
    for k in range(n):
        dep = ops[op, O_DEP0 + k]
        kind = ops[dep, O_KIND]
        if kind != K_S and kind != K_R:
            continue
        ops[dep, O_DEPS] -= 1
        if ops[dep, O_DEPS] == 0:
            base = R_SS0 + sd[ops[dep, O_LOST], SD_SLOT] * SS_FIELDS
            if rs[ri, base + SS_HEAD] == dep:
                if kind == K_S:
                    _try_s(P, ri, base, t)
                elif _try_r(P, ri, base, t) == ST_RMISMATCH:
                    g[G_STATUS] = ST_RMISMATCH
                    return ST_RMISMATCH
    ops[op, O_NDEP] = 0
    return ST_LIMIT


@njit(cache=True)
def _complete_send(P, ri, op, t):
    """Shard._complete for a kernel send; ST_SDRAIN when its stream was sealed and is now empty
    (before the program's check: Python's ops behind it come first, as its stream's next ops)."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    g = _i1(P, A_G)
    slot = sd[ops[op, O_LOST], SD_SLOT]
    base = R_SS0 + slot * SS_FIELDS
    nxt = _message_done(rs, ops, ri, op, t, base)
    if nxt >= 0:
        _try_s(P, ri, base, t)
    elif rs[ri, base + SS_SEAL]:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        g[G_SS] = slot
        return ST_SDRAIN
    if rs[ri, R_SUSP] and not rs[ri, R_SYNC] and rs[ri, R_OUT] <= g[G_MAXAHEAD] >> 1:
        g[G_RET_RI] = ri
        g[G_RET_T] = t
        return ST_RESUME
    return ST_LIMIT


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


# -- entry points over the packed buffers (see H_* above) -------------------------------------------
# Views without reference counts (as netkernels.py's, issue 23): an array numba receives from
# Python, or a slice of one, carries a reference count that numba updates with an atomic
# instruction whenever a variable takes it. A view made from the data pointer (carray) has no count
# to update; the buffers stay alive in OpCore for the whole call (replaced only between calls, when
# grown) and are C-contiguous (numpy.zeros).
#
# The helpers that are not inlined (_start_at, _try_c, _instant, ...: inlining them costs compile
# time) take the arrays' addresses, a tuple of ints (A_*: _table), and make the views they use
# themselves, those only (a view still costs a reference-count call, a no-op on a view, but a
# call): a call passing fifteen arrays copied seven words and made such a call per array, a third
# of an event's time once its rows were prefetched (_run_at). A view's rows are not kept (numba
# checks no bounds, and every index here is from 0: the strides of a C-contiguous array depend on
# its columns only), except the two the kernels read.
(A_RS, A_OPS, A_OF, A_RF, A_TI, A_TF, A_TP, A_PL, A_PLK, A_FREE, A_QN, A_QM, A_TL, A_OVF, A_HEAP, A_G, A_GR,
 A_NTL, A_NOVF) = range(19)  # fmt: skip
# the kernel sends' arrays and the message core's table (netkernels.TABLE), after _table's: the
# entry points add them (_packed), the tests' wrappers stand-ins (no send runs there)
A_SD, A_KC, A_NET = 19, 20, 21
_NET_COLS = 3 * len(_NET_TABLE)
_ROWS = 1 << 40  # a view's rows where they are not kept


@njit(cache=True, inline="always")
def _table(rs, ops, of, rf, ti, tf, tp, pl, plk, free, qn, qm, tl, ovf, heap, g, gr):
    """The arrays' addresses (A_*) for the helpers."""
    return (rs.ctypes.data, ops.ctypes.data, of.ctypes.data, rf.ctypes.data, ti.ctypes.data, tf.ctypes.data,
            tp.ctypes.data, pl.ctypes.data, plk.ctypes.data, free.ctypes.data, qn.ctypes.data, qm.ctypes.data,
            tl.ctypes.data, ovf.ctypes.data, heap.ctypes.data, g.ctypes.data, gr.ctypes.data, tl.shape[0],
            ovf.shape[0])  # fmt: skip


@njit(cache=True, inline="always")
def _i2(P, a, cols):
    return carray(_void_ptr(P[a]), (_ROWS, cols), np.int64)


@njit(cache=True, inline="always")
def _i1(P, a):
    return carray(_void_ptr(P[a]), _ROWS, np.int64)


@njit(cache=True, inline="always")
def _f1(P, a):
    return carray(_void_ptr(P[a]), _ROWS, np.float64)


@njit(cache=True, inline="always")
def _rows(buf, h, cols):
    """The 2-D array of ``cols`` columns whose (offset, rows) header pair is at ``buf[h]`` (a view)."""
    return carray(_void_ptr(buf.ctypes.data + buf[h] * 8), (buf[h + 1], cols), buf.dtype)


@njit(cache=True, inline="always")
def _vec(buf, header, h):
    """The 1-D array whose (offset, length) pair is at ``header[h]``, in ``buf`` (a view)."""
    return carray(_void_ptr(buf.ctypes.data + header[h] * 8), header[h + 1], buf.dtype)


@njit(cache=True, inline="always")
def _packed(ib, gb, fb, tf, free, net):
    """The table of the packed buffers' arrays (one description of the unpacking for every entry),
    then the kernel sends' (A_SD, A_KC) and the message core's table (A_NET)."""
    return _table(_rows(ib, H_RS, R_FIELDS), _rows(ib, H_OPS, O_FIELDS), _vec(fb, ib, H_OF), _vec(fb, ib, H_RF),
                  _rows(gb, H_TI, 3), tf, _rows(gb, H_TP, 2), _rows(gb, H_PL, P_FIELDS), _vec(gb, gb, H_PLK), free,
                  _vec(ib, ib, H_QN), _vec(ib, ib, H_QM), _vec(gb, gb, H_TL), _rows(ib, H_OVF, 4),
                  _rows(ib, H_HEAP, 3), _vec(ib, ib, H_G), _rows(ib, H_GR, GR_FIELDS)) + (
        gb.ctypes.data + gb[H_SD] * 8, gb.ctypes.data + gb[H_KC] * 8, net.ctypes.data)  # fmt: skip


@njit(cache=True)
def _begin_pending(P, ri):
    """begin_block for the block the program launched (``R_BEGIN``, written from Python: one kernel
    call less per block), before anything else of the rank's that needs its first op. Until then
    the kernels see what they would see of it: nothing (a gated first op never starts, is never a
    dependency, and only launch_rest reads ``R_LASTC``)."""
    rs = _i2(P, A_RS, R_FIELDS)
    b = rs[ri, R_BEGIN]
    if b >= 0:
        rs[ri, R_BEGIN] = -1
        _begin_block(P, ri, b)


@njit(cache=True)
def launch_rest(ib, gb, fb, tf, free, net, ri, now):
    P = _packed(ib, gb, fb, tf, free, net)
    _begin_pending(P, ri)
    _launch_rest(P, ri, now)
    _note_room(P)


@njit(cache=True)
def start_block(ib, gb, fb, tf, free, net, ri, t):
    P = _packed(ib, gb, fb, tf, free, net)
    _begin_pending(P, ri)
    _start_block(P, ri, t)
    _note_room(P)


@njit(cache=True)
def cont(ib, gb, fb, tf, free, net, ri, t):
    """The compute stream's loop (Shard._try_start) goes on at ``t`` after an ST_IRESUME."""
    P = _packed(ib, gb, fb, tf, free, net)
    g = _i1(P, A_G)
    g[G_STATUS] = _try_c(P, ri, t)
    _note_room(P)


@njit(cache=True)
def run(ib, gb, fb, tf, free, net, lt, lk, lr, lo, ls, horizon):
    P = _packed(ib, gb, fb, tf, free, net)
    _run_at(P, lt, lk, lr, lo, ls, horizon)
    _note_room(P)


@njit(cache=True)
def _enqueue_message(P, ri, kind, d, size, dep):
    """Shard.launch's rules shared by a tape's kernel send and receive (``kind`` K_S / K_R,
    descriptor ``d``, ``size`` bytes): a new op at its stream slot's tail, after the compute stream's
    last op when ``dep`` (the block just launched, not done: its last op), outstanding counted;
    returns the op and its slot's base."""
    rs = _i2(P, A_RS, R_FIELDS)
    ops = _i2(P, A_OPS, O_FIELDS)
    sd = _i2(P, A_SD, SD_FIELDS)
    g = _i1(P, A_G)
    op = _new_op(rs, ops, g, ri, kind, size)
    ops[op, O_LOST] = d
    if dep:
        last = rs[ri, R_CTAIL]
        if last < 0 or not ops[last, O_LAST] or ops[last, O_STATE] == S_DONE:
            g[G_ERR] = 4  # the compute stream's last op is not the block's last (an engine bug)
        else:
            _add_dep(ops, g, op, last)
    base = R_SS0 + sd[d, SD_SLOT] * SS_FIELDS
    if rs[ri, base + SS_TAIL] >= 0:
        ops[rs[ri, base + SS_TAIL], O_NEXT] = op
    else:
        rs[ri, base + SS_HEAD] = op
    rs[ri, base + SS_TAIL] = op
    rs[ri, R_OUT] += 1
    return op, base


@njit(cache=True)
def _launch_recv(P, ri, d, size, dep, now):
    """Shard.launch of a tape's pipeline receive (descriptor ``d``) on its stream slot, after the
    compute stream's last op when ``dep`` (a block, not done: its last op); the block launched next
    waits for it (R_RPEND). Returns ST_LIMIT, or ST_RMISMATCH (only where it starts: not ``dep``)."""
    rs = _i2(P, A_RS, R_FIELDS)
    op, base = _enqueue_message(P, ri, K_R, d, size, dep)
    rs[ri, R_RPEND] = op
    status = ST_LIMIT
    if rs[ri, base + SS_HEAD] == op:
        status = _try_r(P, ri, base, now)
    return status


@njit(cache=True)
def launch_recv(ib, gb, fb, tf, free, net, ri, d, size, dep, now):
    """:func:`_launch_recv` alone (OpCore.launch_recv). Status ST_LIMIT, or ST_RMISMATCH."""
    P = _packed(ib, gb, fb, tf, free, net)
    g = _i1(P, A_G)
    g[G_STATUS] = _launch_recv(P, ri, d, size, dep, now)
    _note_room(P)


@njit(cache=True)
def complete_recv(ib, gb, fb, tf, free, net, op, t):
    """A kernel receive completes at its hand-over's event (the message core's RECV_DONE): as
    Shard._complete; the status of _recv_rest (an instant op's, ST_RESUME, ST_LIMIT)."""
    P = _packed(ib, gb, fb, tf, free, net)
    ops = _i2(P, A_OPS, O_FIELDS)
    g = _i1(P, A_G)
    ri = ops[op, O_RI]
    g[G_RET_RI] = ri
    g[G_RET_T] = t
    status = ST_LIMIT
    if _recv_done(P, ri, op, t) >= 0:
        status = _try_c(P, ri, t)
    g[G_STATUS] = _recv_rest(P, ri, op, t, status)
    _note_room(P)


@njit(cache=True)
def _launch_send(P, ri, d, size, dep, now):
    """Shard.launch of a pipeline send (descriptor ``d``, ``size`` bytes) on its stream slot, after
    the compute stream's last op when ``dep`` (the block just launched, not done: its last op);
    it starts when it is the stream's head and waits for nothing (p2p.PointToPoint._start_send)."""
    rs = _i2(P, A_RS, R_FIELDS)
    op, base = _enqueue_message(P, ri, K_S, d, size, dep)
    if rs[ri, base + SS_HEAD] == op:
        _try_s(P, ri, base, now)


@njit(cache=True)
def launch_send(ib, gb, fb, tf, free, net, ri, d, size, dep, now):
    """:func:`_launch_send` alone (a send after a step the kernels did not launch, OpCore.launch_send)."""
    P = _packed(ib, gb, fb, tf, free, net)
    _launch_send(P, ri, d, size, dep, now)
    g = _i1(P, A_G)
    g[G_STATUS] = ST_LIMIT
    _note_room(P)


@njit(cache=True)
def launch_step(ib, gb, fb, tf, free, net, ri, now, d, size, dep, rd, rsize):
    """A tape step's block launched to its end, then its send (descriptor ``d`` >= 0) and the next
    step's receive (``rd`` >= 0), in one call (tape.py's phases 2, 3 and the next step's 0;
    OpCore.launch_step): :func:`launch_rest`; where it returns ST_LAUNCHED (no instant op stopped
    it, the program need not suspend first: no Python runs between these launches)
    :func:`_launch_send` (after the block: ``dep``), and unless the program must suspend after it
    (Shard.launch's check) :func:`_launch_recv`, after the block too (it cannot start before the
    block's end: no mismatch here), status ST_STEPPED; else launch_rest's status (ST_LAUNCHED:
    the send was launched, not the receive)."""
    P = _packed(ib, gb, fb, tf, free, net)
    _begin_pending(P, ri)
    _launch_rest(P, ri, now)
    g = _i1(P, A_G)
    if g[G_STATUS] == ST_LAUNCHED:
        if d >= 0:
            _launch_send(P, ri, d, size, dep, now)
        if rd >= 0:
            rs = _i2(P, A_RS, R_FIELDS)
            # (the tape returns after a send where the program is, or must be, suspended)
            if d < 0 or (rs[ri, R_OUT] < g[G_MAXAHEAD] and not rs[ri, R_SUSP]):
                _launch_recv(P, ri, rd, rsize, 1, now)
                g[G_STATUS] = ST_STEPPED
    _note_room(P)

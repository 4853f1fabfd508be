"""A block's streams in the compiled per-op engine (split from opkernels.py): the rules of shard.py
(``launch``, ``_try_start``, ``_complete``, ``_instant``) for the compute and tensor streams of an op
block, and the tensor group's closed-form collectives (``_start_at``: collective_run._rendezvous,
netmodel/links.py ``LinkModel.hold``): a block begun and launched (``_begin_block``,
``_launch_rest``), a stream's head started (``_try_c``, ``_try_t``), an op completed
(``_complete``, ``_instant``) and a tape's next block chained where one ends (``_chain``).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import void_ptr as _void_ptr
from emulator.engine.opheap import _add_dep, _forget, _new_op, _push
from emulator.engine.oplayout import (
    A_FREE,
    A_G,
    A_GR,
    A_HEAP,
    A_NOVF,
    A_NTL,
    A_OF,
    A_OPS,
    A_OVF,
    A_PL,
    A_PLK,
    A_QM,
    A_QN,
    A_RF,
    A_RS,
    A_TF,
    A_TI,
    A_TL,
    A_TP,
    G_BUCKET,
    G_ERR,
    G_MAXAHEAD,
    G_NOVF,
    G_PREL,
    G_RET_OP,
    G_RET_RI,
    G_RET_T,
    G_RET_TSTART,
    G_STATUS,
    GR_FIELDS,
    GR_MEM0,
    GR_N,
    GR_SIG,
    I_A,
    I_C,
    I_F,
    I_W,
    K_A,
    K_C,
    K_F,
    K_M,
    O_DEP0,
    O_DEPS,
    O_FIELDS,
    O_GATE,
    O_KIND,
    O_LAST,
    O_LOST,
    O_NDEP,
    O_NEXT,
    O_STATE,
    O_TSTART,
    O_VAL,
    P_ARRIVALS,
    P_CALLS,
    P_CCOUNT,
    P_CNS,
    P_DUR,
    P_FIELDS,
    P_GROUP,
    P_LLEN,
    P_LPTR,
    P_MAXWAIT,
    P_MEMBERS,
    P_MSGB,
    P_MSGS,
    P_SIG,
    R_ADONE,
    R_ASTART,
    R_AUTO,
    R_BEGIN,
    R_BPOS,
    R_BT,
    R_CAP,
    R_CBLK,
    R_CBY,
    R_CHEAD,
    R_CNS,
    R_COMMNS,
    R_CTAIL,
    R_FIELDS,
    R_LAST,
    R_LASTC,
    R_LOST,
    R_MEM,
    R_NWAIT,
    R_OPSDONE,
    R_OUT,
    R_PEAK,
    R_PEND,
    R_RANK,
    R_RPEND,
    R_SEQ,
    R_SS0,
    R_SUSP,
    R_SYNC,
    R_TBLK,
    R_THEAD,
    R_TTAIL,
    R_WAIT0,
    R_WCT,
    R_WCT_HIT,
    R_WTC,
    R_WTC_HIT,
    S_DONE,
    S_LAUNCHED,
    S_STARTED,
    SS_CHIT,
    SS_CWAIT,
    SS_FIELDS,
    ST_BLOCK_DONE,
    ST_IBLOCK,
    ST_ICHAIN,
    ST_IRESUME,
    ST_LAUNCHED,
    ST_LIMIT,
    ST_OOM,
    ST_RESUME,
    ST_RMISMATCH,
    ST_SUSPEND,
    _f1,
    _i1,
    _i2,
    _table,
)
from emulator.engine.opsends import _release_sends


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

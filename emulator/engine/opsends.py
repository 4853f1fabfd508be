"""A tape's pipeline messages in the compiled per-op engine (split from opkernels.py): the rules of
p2p.py (``_start_send``, ``_start_recv``) for the sends and receives on a rank's stream slots, over
the message core's arrays (netkernels' table): a message queued on its stream
(``_enqueue_message``), a stream's head started (``_head_starts``, ``_try_s``, ``_try_r``), a
receive's or send's completion (``_recv_done``, ``_complete_send``, ``_message_done``) and the sends
a compute op released (``_release_sends``); the room left in the message core's arrays (``_net_room``).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
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
    X_CHAN,
    X_PEER,
    X_RID,
    X_SIZE,
    _ht_delete,
    _ht_find,
    _ht_insert,
    _inject,
    _set_top,
    _views,
)
from emulator.engine.opheap import _add_dep, _new_op, _push
from emulator.engine.oplayout import (
    _NET_COLS,
    A_G,
    A_HEAP,
    A_KC,
    A_NET,
    A_OPS,
    A_RS,
    A_SD,
    G_ERR,
    G_LOW,
    G_MAXAHEAD,
    G_NET,
    G_PREL,
    G_RDRAIN,
    G_RDRAIN_RI,
    G_RDRAIN_T,
    G_RET_OP,
    G_RET_RI,
    G_RET_T,
    G_RET_TSTART,
    G_SENT,
    G_SS,
    G_STATUS,
    K_R,
    K_S,
    NET_LOW,
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
    R_BEGIN,
    R_CBY,
    R_CHEAD,
    R_COMMNS,
    R_CTAIL,
    R_FIELDS,
    R_LAST,
    R_OPSDONE,
    R_OUT,
    R_RANK,
    R_RPEND,
    R_SEQ,
    R_SS0,
    R_SUSP,
    R_SYNC,
    S_DONE,
    S_LAUNCHED,
    S_STARTED,
    SD_CTR,
    SD_DST,
    SD_FIELDS,
    SD_RID,
    SD_SLOT,
    SD_TAG,
    SS_BLK,
    SS_FIELDS,
    SS_HEAD,
    SS_HIT,
    SS_SEAL,
    SS_TAIL,
    SS_WAIT,
    ST_LIMIT,
    ST_RESUME,
    ST_RMISMATCH,
    ST_SDRAIN,
    _i1,
    _i2,
)


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
def _launch_send(P, ri, d, size, dep, now):
    """Shard.launch of a pipeline send (descriptor ``d``, ``size`` bytes) on its stream slot, after
    the compute stream's last op when ``dep`` (the block just launched, not done: its last op);
    it starts when it is the stream's head and waits for nothing (p2p.PointToPoint._start_send)."""
    rs = _i2(P, A_RS, R_FIELDS)
    op, base = _enqueue_message(P, ri, K_S, d, size, dep)
    if rs[ri, base + SS_HEAD] == op:
        _try_s(P, ri, base, now)

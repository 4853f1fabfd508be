"""A message's journey in the message core (compiled; netkernels.py): its injection on the
sender's up-links (a collective step's or a pipeline send's), its hand-over to the receiver's
down-links, and there the matching with its receive - a collective channel waiting for it, a
point-to-point receive waiting for it, or the mailbox until one asks."""

from __future__ import annotations

import numpy as np
from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netheap import _push
from emulator.engine.netlayout import (
    BUCKET,
    C_PENDING,
    C_RUN,
    C_TEND,
    EV_HANDOVER,
    EV_OP_DONE,
    EV_STEP,
    FOLD,
    HT_MSG,
    HT_RECV,
    HT_WAITER,
    M_CHAN,
    M_CSEQ,
    M_DST,
    M_ENDUP,
    M_GID,
    M_K,
    M_RID,
    M_SEQ,
    M_SIG_HI,
    M_SIG_LO,
    M_SIZE,
    M_SRC,
    M_T,
    MFREE_N,
    MISMATCH,
    MSG_N,
    OUT_N,
    R_SIG_HI,
    R_SIG_LO,
    RECV_MISMATCH,
    RET_PEER,
    RET_RANK,
    RET_RUN,
    RET_SIG_HI,
    RET_SIG_LO,
    RET_T,
    RT_LAT,
    RT_LINKS,
    RT_NDOWN,
    RT_NUP,
    RT_TIER,
    SEQ_COL,
    SHARD,
    STATUS,
    X_CHAN,
    X_PEER,
    X_RID,
    X_SIZE,
)
from emulator.engine.netlinks import _finish, _queued, _reserve, _windowed
from emulator.engine.netmailbox import _ht_delete, _ht_find, _ht_insert
from emulator.engine.netstats import _bit_length, timeline_add


@njit(cache=True, inline="always")
def _write_msg(arr, i, t_hand, dst, src, seq, size, end_up, gid, cseq, chan, k, sig_lo, sig_hi, rid):
    arr[i, M_T] = t_hand
    arr[i, M_DST] = dst
    arr[i, M_SRC] = src
    arr[i, M_SEQ] = seq
    arr[i, M_SIZE] = size
    arr[i, M_ENDUP] = end_up
    arr[i, M_GID] = gid
    arr[i, M_CSEQ] = cseq
    arr[i, M_CHAN] = chan
    arr[i, M_K] = k
    arr[i, M_SIG_LO] = sig_lo
    arr[i, M_SIG_HI] = sig_hi
    arr[i, M_RID] = rid


@njit(cache=True, inline="always")
def _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat, tstat, khist, tl, pend, rank_shard, mseq,
            outb, xf, x, src, gid, cseq, k, sig_lo, sig_hi, kind, t):  # fmt: skip
    """Put transfer ``x``'s message on the sender's up-links at ``t``; returns when its tail has
    left. (At most 30 arguments: CPython passes more as ``*args``, which numba cannot inline.)"""
    dst, size, rid, chan = xf[x, X_PEER], xf[x, X_SIZE], xf[x, X_RID], xf[x, X_CHAN]
    nup = rt[rid, RT_NUP]
    start = t
    blocker = -1
    for j in range(nup):
        link = rt[rid, RT_LINKS + j]
        if lfree[link] > start:
            start = lfree[link]
            blocker = link
    _reserve(lfree, lstat, lbw, lwp, lwns, lwf, rt, rid, RT_LINKS, nup, size, start, t)
    _queued(lstat, blocker, start - t)
    up = rt[rid, RT_LINKS : RT_LINKS + nup]
    if _windowed(lwp, up):
        end_up = _finish(lbw, lwp, lwns, lwf, up, size, start)
    else:
        end_up = start + np.int64(-((-size) // rbw[rid, 0]))
    seq = mseq[src] + 1
    mseq[src] = seq
    # accounting (ShardStats.messages): a representative's message stands for ``fold`` of them
    tier = rt[rid, RT_TIER]
    count = st[FOLD]
    tstat[tier, 0] += size * count
    tstat[tier, 1] += count
    b = _bit_length(size - 1) if size > 0 else 0
    tstat[tier, 2 + b] += count
    khist[kind, b] += count
    timeline_add(tl, pend, st, tier, size, count, start, end_up, st[BUCKET])
    t_hand = start + rt[rid, RT_LAT]
    shard = rank_shard[dst]
    if shard == st[SHARD]:
        if st[MFREE_N] > 0:
            st[MFREE_N] -= 1
            m = mfree[st[MFREE_N]]
        else:
            m = st[MSG_N]
            st[MSG_N] = m + 1
        _write_msg(msg, m, t_hand, dst, src, seq, size, end_up, gid, cseq, chan, k, sig_lo, sig_hi, rid)
        _push(heap, st, t_hand, EV_HANDOVER, dst, src, seq, m)
    else:
        o = st[OUT_N]
        st[OUT_N] = o + 1
        _write_msg(outb, o, t_hand, dst, src, seq, size, end_up, gid, cseq, chan, k, sig_lo, sig_hi, rid)
        outb[o, 13] = shard
    return end_up


@njit(cache=True, inline="always")
def _mismatch(st, run, rank, peer, sig_lo, sig_hi, t):
    st[STATUS] = MISMATCH
    st[RET_RUN] = run
    st[RET_RANK] = rank
    st[RET_PEER] = peer
    st[RET_SIG_LO] = sig_lo
    st[RET_SIG_HI] = sig_hi
    st[RET_T] = t


@njit(cache=True, inline="always")
def _handover(st, heap, msg, mfree, htk, htv, hts, runs, chans, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat, cseqs, pseq,
              pidx, m, t):  # fmt: skip
    rid = msg[m, M_RID]
    size = msg[m, M_SIZE]
    nup = rt[rid, RT_NUP]
    ndown = rt[rid, RT_NDOWN]
    start = t
    blocker = -1
    for j in range(ndown):
        link = rt[rid, RT_LINKS + nup + j]
        if lfree[link] > start:
            start = lfree[link]
            blocker = link
    down = rt[rid, RT_LINKS + nup : RT_LINKS + nup + ndown]
    if _windowed(lwp, down):
        end_down = _finish(lbw, lwp, lwns, lwf, down, size, start)
    else:
        end_down = start + np.int64(-((-size) // rbw[rid, 1]))
    _reserve(lfree, lstat, lbw, lwp, lwns, lwf, rt, rid, RT_LINKS + nup, ndown, size, start, t)
    _queued(lstat, blocker, start - t)
    delivery = max(msg[m, M_ENDUP] + rt[rid, RT_LAT], end_down)
    dst, src = msg[m, M_DST], msg[m, M_SRC]
    gid, cseq, chan, k = msg[m, M_GID], msg[m, M_CSEQ], msg[m, M_CHAN], msg[m, M_K]
    sig_lo, sig_hi = msg[m, M_SIG_LO], msg[m, M_SIG_HI]
    mfree[st[MFREE_N]] = m
    st[MFREE_N] += 1
    # a point-to-point message (group id 0, p2p.PointToPoint._handover) meets a waiting receive
    i = _ht_find(htk, hts, HT_WAITER if gid != 0 else HT_RECV, dst, gid, cseq, chan, src, k)
    if i >= 0 and gid == 0:
        recv, want, t_start = htv[i, 0], htv[i, 1], htv[i, 2]
        _ht_delete(htk, htv, hts, st, i)
        if want != size:
            st[STATUS] = RECV_MISMATCH
            st[RET_RUN] = recv
            st[RET_RANK] = dst
            st[RET_PEER] = src
            st[RET_SIG_LO] = size
            st[RET_T] = t
            return
        # the receive's completion takes the rank's one event counter now, as Shard._push would
        row = pidx[dst]
        s = pseq[row, st[SEQ_COL]] + 1
        pseq[row, st[SEQ_COL]] = s
        _push(heap, st, max(delivery, t_start), EV_OP_DONE, dst, dst, s, recv)
        return
    if i < 0:
        j = _ht_insert(htk, hts, st, HT_MSG, dst, gid, cseq, chan, src, k)
        htv[j, 0] = delivery
        htv[j, 1] = size
        htv[j, 2] = sig_lo
        htv[j, 3] = sig_hi
        return
    c = htv[i, 0]
    _ht_delete(htk, htv, hts, st, i)
    run = chans[c, C_RUN]
    if sig_lo != runs[run, R_SIG_LO] or sig_hi != runs[run, R_SIG_HI]:
        _mismatch(st, run, dst, src, sig_lo, sig_hi, t)
        return
    chans[c, C_PENDING] -= 1
    if delivery > chans[c, C_TEND]:
        chans[c, C_TEND] = delivery
    if chans[c, C_PENDING] == 0:
        s = cseqs[dst] + 1
        cseqs[dst] = s
        _push(heap, st, chans[c, C_TEND], EV_STEP, dst, dst, s, c)

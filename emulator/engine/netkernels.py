"""The compiled kernels of the message-level collective engine (numba; used by netcore.NetCore).

A collective expanded into messages (netmodel/collectives: channels of segments of steps) is
executed here instead of in Python: the steps of every member, the link reservations of their
messages, the hand-overs and the matching of receives. It is the same algorithm as the reference
path (:class:`~emulator.engine.collective_run.CollectiveExecution`, ``engine.collective_engine:
python``) and gives the same results bit for bit (tests/emulator/test_netcore.py), at a fraction of
CPython's cost per event: one compiled call runs every message event up to the next event that
needs Python (an operation completing, an error).

Ordering. The kernels keep their own heap of ``(time, kind, rank, origin, seq, payload)`` events -
hand-overs of collective messages and collective steps - which the shard merges with its Python
heap by key. The keys are those the reference path would create: a step's ``seq`` is a per-rank
counter of steps (its relative order among the rank's steps is push order, as in the reference),
and a hand-over's ``seq`` is the sender's message counter, shared with point-to-point sends
(``mseq``), so that every key is unique across both heaps and the merged order is the reference
order. A point-to-point receive's completion (a message meeting its waiting receive at the
hand-over) is ``(delivery or the receive's start, EV_OP_DONE, rank, rank, seq)``, its ``seq``
taken from the rank's one event counter at the hand-over (``pseq``: the per-op engine's rank rows,
shared with the Python rules), as p2p.PointToPoint._handover takes it.

The kernels are split by what they model: netlayout.py names the arrays (the slots of ``st``, the
tables' columns, the statuses, the one table of addresses every entry point takes), netheap.py is
the event heap, netmailbox.py the hash table of messages and waiting receivers, netlinks.py the link
model, netstats.py the message statistics and netmessages.py a message's injection, hand-over and
receive matching. This module holds the collective steps and the entry points Python calls, and
re-exports the names the other engine modules take from it (``__all__``). The modules call each
other in one direction only (layout <- heap, mailbox, links, statistics <- messages <- here): numba
compiles kernels that call each other in a cycle but crashes loading them from its cache.
"""

from __future__ import annotations

from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netheap import _pop, _push, _set_top, _top_before
from emulator.engine.netlayout import (
    ACTIVE,
    C_PENDING,
    C_RANK,
    C_REP,
    C_RUN,
    C_SEG,
    C_SEG_END,
    C_TEND,
    COMPLETE,
    EV_HANDOVER,
    EV_OP_DONE,
    EV_STEP,
    EVENTS,
    GROW,
    HEAP_N,
    HT_FILL,
    HT_MSG,
    HT_RECV,
    HT_WAITER,
    M_DST,
    M_RID,
    M_SEQ,
    M_SRC,
    M_T,
    MAXX,
    MFREE_N,
    MISMATCH,
    MSG_N,
    N_CHANS,
    N_CNT,
    N_RUNS,
    N_SEGS,
    N_XFERS,
    NO_LIMIT,
    OK,
    OUT_N,
    PEND_N,
    R_CLO,
    R_CNT,
    R_CSEQ,
    R_GID,
    R_KIND,
    R_LEFT,
    R_NCH,
    R_RANK,
    R_SIG_HI,
    R_SIG_LO,
    R_TEND,
    RECV_DONE,
    RET_PEER,
    RET_RANK,
    RET_RUN,
    RET_SEQ,
    RET_SIG_LO,
    RET_T,
    S_REP,
    S_RLO,
    S_RN,
    S_SLO,
    S_SN,
    SEND_KIND,
    SEND_ROOM,
    STATUS,
    T_HEAP,
    T_HTK,
    T_HTS,
    T_HTV,
    T_KHIST,
    T_LBW,
    T_LFREE,
    T_LSTAT,
    T_LWF,
    T_LWNS,
    T_LWP,
    T_MFREE,
    T_MSEQ,
    T_MSG,
    T_OUTB,
    T_PEND,
    T_PX,
    T_RANK_SHARD,
    T_RBW,
    T_RT,
    T_ST,
    T_TL,
    T_TSTAT,
    TABLE,
    TABLE_COLS,
    TOP_KIND,
    TOP_ORIGIN,
    TOP_RANK,
    TOP_SEQ,
    TOP_T,
    TP_HDR,
    TP_KIND,
    TP_MAXX,
    TP_NCH,
    TP_NCNT,
    TP_NSEG,
    TP_NX,
    X_CHAN,
    X_CSLOT,
    X_PEER,
    X_RID,
    X_SIZE,
    _f1,
    _f2,
    _i1,
    _i2,
    _views,
)
from emulator.engine.netlinks import _finish
from emulator.engine.netmailbox import _ht_delete, _ht_find, _ht_insert, rehash
from emulator.engine.netmessages import _handover, _inject, _mismatch
from emulator.engine.netstats import timeline_add

# the names other modules take from here (opkernels, shard, p2p, collective_run, opcore, tests): the
# entry points, and the layout and helpers of the split modules as they were before the split
__all__ = [
    "COMPLETE", "GROW", "HEAP_N", "HT_FILL", "HT_MSG", "HT_RECV", "MAXX", "MISMATCH", "MSG_N", "NO_LIMIT", "OUT_N",
    "PEND_N", "RECV_DONE", "RET_PEER", "RET_RANK", "RET_RUN", "RET_SEQ", "RET_SIG_LO", "RET_T", "SEND_KIND",
    "SEND_ROOM", "TABLE", "TABLE_COLS", "TOP_KIND", "TOP_ORIGIN", "TOP_RANK", "TOP_SEQ", "TOP_T", "T_HEAP", "T_HTK",
    "T_MSG", "T_OUTB", "T_PEND", "T_ST", "X_CHAN", "X_PEER", "X_RID", "X_SIZE", "_finish", "_ht_delete", "_ht_find",
    "_ht_insert", "_inject", "_set_top", "_views", "deliver_records", "rehash", "run_events", "send_message",
    "start_receive", "start_call", "timeline_add",
]  # fmt: skip


@njit(cache=True, inline="always")
def _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
          tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, c, t):  # fmt: skip
    """The channel's next step at ``t`` (its previous one has ended), or its end."""
    run = chans[c, C_RUN]
    seg = chans[c, C_SEG]
    end = chans[c, C_SEG_END]
    while seg < end and chans[c, C_REP] == 0:
        seg += 1
        if seg < end:
            chans[c, C_REP] = segs[seg, S_REP]
    chans[c, C_SEG] = seg
    if seg == end:
        runs[run, R_LEFT] -= 1
        if t > runs[run, R_TEND]:
            runs[run, R_TEND] = t
        if runs[run, R_LEFT] == 0:
            st[ACTIVE] -= 1
            st[STATUS] = COMPLETE
            st[RET_RUN] = run
            st[RET_T] = runs[run, R_TEND]
        return
    chans[c, C_REP] -= 1
    rank = chans[c, C_RANK]
    gid, cseq = runs[run, R_GID], runs[run, R_CSEQ]
    sig_lo, sig_hi = runs[run, R_SIG_LO], runs[run, R_SIG_HI]
    base = runs[run, R_CNT]
    kind = runs[run, R_KIND]
    t_end = t
    lo = segs[seg, S_SLO]
    for x in range(lo, lo + segs[seg, S_SN]):
        slot = base + xf[x, X_CSLOT]
        k = cnt[slot]
        cnt[slot] = k + 1
        e = _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat, tstat, khist, tl, pend,
                    rank_shard, mseq, outb, xf, x, rank, gid, cseq, k, sig_lo, sig_hi, kind, t)  # fmt: skip
        if e > t_end:
            t_end = e
    pending = 0
    lo = segs[seg, S_RLO]
    for x in range(lo, lo + segs[seg, S_RN]):
        slot = base + xf[x, X_CSLOT]
        k = cnt[slot]
        cnt[slot] = k + 1
        peer, chan = xf[x, X_PEER], xf[x, X_CHAN]
        i = _ht_find(htk, hts, HT_MSG, rank, gid, cseq, chan, peer, k)
        if i < 0:
            j = _ht_insert(htk, hts, st, HT_WAITER, rank, gid, cseq, chan, peer, k)
            htv[j, 0] = c
            pending += 1
        else:
            delivery, peer_lo, peer_hi = htv[i, 0], htv[i, 2], htv[i, 3]
            _ht_delete(htk, htv, hts, st, i)
            if peer_lo != sig_lo or peer_hi != sig_hi:
                _mismatch(st, run, rank, peer, peer_lo, peer_hi, t)
                return
            if delivery > t_end:
                t_end = delivery
    chans[c, C_PENDING] = pending
    chans[c, C_TEND] = t_end
    if pending == 0:
        s = cseqs[rank] + 1
        cseqs[rank] = s
        _push(heap, st, t_end, EV_STEP, rank, rank, s, c)


@njit(cache=True, inline="always")
def _room(st, heap, msg, htk, outb, pend):
    """Whether every array can take what one event may add (up to MAXX messages), and SEND_ROOM more:
    what the per-op engine's kernel sends may add before the shard grows the arrays (opkernels.G_LOW)."""
    need = st[MAXX] + 2 + SEND_ROOM
    return (st[HEAP_N] + need <= heap.shape[0] and st[MSG_N] + need <= msg.shape[0]
            and 2 * (st[HT_FILL] + need) <= htk.shape[0] and st[OUT_N] + need <= outb.shape[0]
            and st[PEND_N] + need <= pend.shape[0])  # fmt: skip


# nogil: a long call (a flat ring over thousands of GPUs runs for minutes in one) would otherwise hold
# the interpreter lock throughout, and netcore.prepare_kernels' thread, compiling the other kernels
# after a first run, could not progress beside it (the progress line said "compiling kernels" to the
# end). The kernels touch no Python object; the shard's thread is the only one that calls them.
@njit(cache=True, nogil=True)
def run_events(p, l0, l1, l2, l3, l4, horizon):
    """Process the core's events before ``horizon`` whose keys precede ``(l0, .., l4)`` (the
    Python heap's top); stop after an event that needs Python (STATUS) or when an array is full.
    Returns the status (also in ``st[STATUS]``).
    ``p``: the table of the core's arrays (TABLE)."""
    (st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
     tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, pseq, pidx, _) = _views(p)  # fmt: skip
    st[STATUS] = OK
    while st[HEAP_N] > 0:
        if heap[0, 0] >= horizon or not _top_before(heap, l0, l1, l2, l3, l4):
            break
        if not _room(st, heap, msg, htk, outb, pend):
            st[STATUS] = GROW
            break
        t, kind, rank, seq, payload = heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 4], heap[0, 5]
        _pop(heap, st)
        st[EVENTS] += 1
        if kind == EV_HANDOVER:
            _handover(st, heap, msg, mfree, htk, htv, hts, runs, chans, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
                      cseqs, pseq, pidx, payload, t)  # fmt: skip
        elif kind == EV_OP_DONE:  # a point-to-point receive completes: the shard completes its op
            st[STATUS] = RECV_DONE
            st[RET_RUN] = payload
            st[RET_RANK] = rank
            st[RET_SEQ] = seq
            st[RET_T] = t
            break
        else:
            _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf,
                  lstat, tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, payload, t)  # fmt: skip
        if st[STATUS] != OK:
            break
    _set_top(st, heap)
    return st[STATUS]


@njit(cache=True, nogil=True)
def start_call(p, tp, gid, cseq, sig_lo, sig_hi, rank, t):
    """A member starts a collective at ``t`` (NetCore.start): its call's rows from the template
    ``tp`` (netlayout's TP_* layout: NetCore._template), put after the tables' rows in use, then the
    first step of each of its channels, in order. Returns the status, or GROW with nothing done
    (but the widest step noted) when a table cannot take the call and the messages of its first
    steps: NetCore._ensure's tests, which the caller then runs before calling again.
    (One call for what took a dozen numpy writes in Python, each a microsecond.)"""
    (st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
     tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, pseq, pidx, _) = _views(p)  # fmt: skip
    nch, nseg, nx, n_cnt = tp[TP_NCH], tp[TP_NSEG], tp[TP_NX], tp[TP_NCNT]
    if tp[TP_MAXX] > st[MAXX]:
        st[MAXX] = tp[TP_MAXX]
    run, c0, s0, x0, k0 = st[N_RUNS], st[N_CHANS], st[N_SEGS], st[N_XFERS], st[N_CNT]
    per_event = nch * (st[MAXX] + 2) + SEND_ROOM
    if (run + 1 > runs.shape[0] or c0 + nch > chans.shape[0] or s0 + nseg > segs.shape[0] or x0 + nx > xf.shape[0]
            or k0 + n_cnt > cnt.shape[0] or st[HEAP_N] + per_event > heap.shape[0]
            or st[OUT_N] + per_event > outb.shape[0] or st[MSG_N] + per_event > msg.shape[0]
            or st[PEND_N] + per_event > pend.shape[0] or 2 * (st[HT_FILL] + per_event) > htk.shape[0]):  # fmt: skip
        return GROW
    st[N_RUNS], st[N_CHANS], st[N_SEGS], st[N_XFERS], st[N_CNT] = run + 1, c0 + nch, s0 + nseg, x0 + nx, k0 + n_cnt
    runs[run, R_GID] = gid
    runs[run, R_CSEQ] = cseq
    runs[run, R_SIG_LO] = sig_lo
    runs[run, R_SIG_HI] = sig_hi
    runs[run, R_LEFT] = nch
    runs[run, R_TEND] = 0
    runs[run, R_RANK] = rank
    runs[run, R_KIND] = tp[TP_KIND]
    runs[run, R_CLO] = c0
    runs[run, R_NCH] = nch
    runs[run, R_CNT] = k0
    o = TP_HDR
    for c in range(c0, c0 + nch):
        chans[c, C_RUN] = run
        chans[c, C_SEG] = tp[o] + s0
        chans[c, C_SEG_END] = tp[o + 1] + s0
        chans[c, C_REP] = tp[o + 2]
        chans[c, C_PENDING] = 0
        chans[c, C_TEND] = 0
        chans[c, C_RANK] = rank
        o += 3
    for s in range(s0, s0 + nseg):
        segs[s, S_SLO] = tp[o + S_SLO] + x0
        segs[s, S_SN] = tp[o + S_SN]
        segs[s, S_RLO] = tp[o + S_RLO] + x0
        segs[s, S_RN] = tp[o + S_RN]
        segs[s, S_REP] = tp[o + S_REP]
        o += 5
    for x in range(x0, x0 + nx):
        for j in range(5):
            xf[x, j] = tp[o + j]
        o += 5
    for k in range(k0, k0 + n_cnt):
        cnt[k] = 0
    st[STATUS] = OK
    st[ACTIVE] += 1
    for c in range(c0, c0 + nch):
        _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf,
              lstat, tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, c, t)  # fmt: skip
        if st[STATUS] != OK:
            break
    _set_top(st, heap)
    return st[STATUS]


@njit(cache=True, nogil=True)
def deliver_records(st, heap, msg, mfree, recs, rids):
    """Cross-shard messages (rows of the outbox layout) into the heap."""
    for i in range(recs.shape[0]):
        if st[MFREE_N] > 0:
            st[MFREE_N] -= 1
            m = mfree[st[MFREE_N]]
        else:
            m = st[MSG_N]
            st[MSG_N] = m + 1
        msg[m, :M_RID] = recs[i, :M_RID]
        msg[m, M_RID] = rids[i]
        _push(heap, st, recs[i, M_T], EV_HANDOVER, recs[i, M_DST], recs[i, M_SRC], recs[i, M_SEQ], m)
    _set_top(st, heap)


# -- point-to-point messages (p2p.PointToPoint's compiled path) ----------------------------------
@njit(cache=True, nogil=True)
def send_message(p, src, dst, rid, size, tag, k, t):
    """A pipeline send's message (PointToPoint._inject: group id 0, keyed by its tag and its number
    ``k`` among the sender's messages to ``dst`` with that tag, signed with its size) put on its
    up-links at ``t``; returns when its tail has left, or -1 (nothing done) when an array is full."""
    st, heap, msg, mfree, htk = _i1(p, T_ST), _i2(p, T_HEAP), _i2(p, T_MSG), _i1(p, T_MFREE), _i2(p, T_HTK)
    rt, rbw, lbw, lfree = _i2(p, T_RT), _f2(p, T_RBW), _f1(p, T_LBW), _i1(p, T_LFREE)
    lwp, lwns, lwf, lstat = _i1(p, T_LWP), _i2(p, T_LWNS), _f1(p, T_LWF), _i2(p, T_LSTAT)
    tstat, khist, tl, pend = _i2(p, T_TSTAT), _i2(p, T_KHIST), _i2(p, T_TL), _i2(p, T_PEND)
    rank_shard, mseq, outb, px = _i1(p, T_RANK_SHARD), _i1(p, T_MSEQ), _i2(p, T_OUTB), _i2(p, T_PX)
    if not _room(st, heap, msg, htk, outb, pend):
        return -1
    # _inject reads the message from a transfer row: one scratch row (its slot and channel unused)
    px[0, X_PEER] = dst
    px[0, X_SIZE] = size
    px[0, X_CHAN] = 0
    px[0, X_RID] = rid
    end_up = _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat, tstat, khist, tl, pend,
                     rank_shard, mseq, outb, px, 0, src, 0, tag, k, size, 0, SEND_KIND, t)  # fmt: skip
    _set_top(st, heap)
    return end_up


@njit(cache=True, nogil=True)
def start_receive(p, rank, src, tag, k, recv, size, t):
    """A pipeline receive starts at ``t`` (PointToPoint._start_recv): its message's delivery time
    when the message is in the mailbox (taken out; -3 when its size differs from ``size``: then
    ``st[RET_SIG_LO]`` is the message's), else -1: the receive ``recv`` waits for it (-2: nothing
    done, the hash table is full)."""
    st, htk, htv, hts = _i1(p, T_ST), _i2(p, T_HTK), _i2(p, T_HTV), _i1(p, T_HTS)
    i = _ht_find(htk, hts, HT_MSG, rank, 0, tag, 0, src, k)
    if i >= 0:
        delivery, got = htv[i, 0], htv[i, 1]
        _ht_delete(htk, htv, hts, st, i)
        if got != size:
            st[RET_SIG_LO] = got
            return -3
        return delivery
    if 2 * (st[HT_FILL] + 1) > htk.shape[0]:
        return -2
    j = _ht_insert(htk, hts, st, HT_RECV, rank, 0, tag, 0, src, k)
    htv[j, 0] = recv
    htv[j, 1] = size
    htv[j, 2] = t
    return -1

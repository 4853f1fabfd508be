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

State is a set of numpy arrays (no numba containers: unboxing those costs microseconds per call):
a binary heap, a message store with a free list, an open-addressing hash table for the mailbox and
the waiting receives, tables of runs, channels, segments and transfers, route tables, the link
state shared with the shard (``lfree``) and statistics. A kernel that could overflow an array
returns ``GROW`` before touching anything (see ``_room``); the caller enlarges the arrays.

The address-to-pointer intrinsic comes from kernel_memory.py, shared with the op kernels; numba's
cache notices changes to a function's own file only, so kernel_cache.py stamps every kernel file
with all of them (an edit of kernel_memory.py recompiles these kernels too).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import events, kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.kernel_memory import void_ptr as _void_ptr

# The event kinds, as literals: numba freezes globals into cached kernels and only notices changes
# to this file, so a change in events.py must fail here rather than reorder events silently.
EV_HANDOVER, EV_STEP, EV_OP_DONE = 0, 1, 2
assert (EV_HANDOVER, EV_STEP, EV_OP_DONE) == (events.EV_HANDOVER, events.EV_STEP, events.EV_OP_DONE), (
    "update netkernels' event kinds")

# -- scalar slots of ``st`` -------------------------------------------------------------------
(HEAP_N, EVENTS, MSG_N, MFREE_N, HT_FILL, N_RUNS, N_CHANS, N_SEGS, N_XFERS, N_CNT, ACTIVE, OUT_N,
 PEND_N, STATUS, RET_RUN, RET_T, RET_RANK, RET_PEER, RET_SIG_LO, RET_SIG_HI, FOLD, SHARD, BUCKET,
 MAXX, TOP_T, TOP_KIND, TOP_RANK, TOP_ORIGIN, TOP_SEQ, SEQ_COL, RET_SEQ, N_ST) = range(32)  # fmt: skip
# RECV_DONE: a point-to-point receive completed (RET_RUN: its id, RET_T, RET_RANK, RET_SEQ: its
# event's key is (RET_T, EV_OP_DONE, RET_RANK, RET_RANK, RET_SEQ)); RECV_MISMATCH:
# a message met a waiting receive of another size (RET_RUN, RET_RANK, RET_PEER: the sender,
# RET_SIG_LO: the message's size, RET_T: the hand-over)
OK, COMPLETE, MISMATCH, GROW, RECV_DONE, RECV_MISMATCH = 0, 1, 2, 3, 4, 5
SIG_BITS = 62  # signatures are Python ints up to 2^64: kept as two int64 halves
SIG_MASK = (1 << SIG_BITS) - 1
NO_LIMIT = 1 << 62  # "no horizon" / "no Python event" as an int64
TIMELINE_MAX_SLOTS = 1 << 22  # beyond this many time buckets, the timeline is kept by ShardStats
HIST = 66  # size-histogram buckets: 0 B, then (2^(b-1), 2^b] for b = 1..65

# columns
M_T, M_DST, M_SRC, M_SEQ, M_SIZE, M_ENDUP, M_GID, M_CSEQ, M_CHAN, M_K, M_SIG_LO, M_SIG_HI, M_RID = range(13)
R_GID, R_CSEQ, R_SIG_LO, R_SIG_HI, R_LEFT, R_TEND, R_RANK, R_KIND, R_CLO, R_NCH, R_CNT = range(11)
C_RUN, C_SEG, C_SEG_END, C_REP, C_PENDING, C_TEND, C_RANK = range(7)
S_SLO, S_SN, S_RLO, S_RN, S_REP = range(5)
X_PEER, X_SIZE, X_CHAN, X_RID, X_CSLOT = range(5)
RT_TIER, RT_LAT, RT_NUP, RT_NDOWN, RT_LINKS = range(5)  # then up links, then down links
# HT_RECV: a point-to-point receive waiting (values: its id, its size, its start time)
HT_EMPTY, HT_MSG, HT_WAITER, HT_RECV = range(4)
SEND_KIND = 7  # the khist row of point-to-point sends: after netmodel's OPS (netcore checks it)
SEND_ROOM = 16  # messages the arrays keep free after any call (_room; opkernels.NET_LOW)


# -- the entry points' one argument: a table of the arrays -------------------------------------
# numba's dispatcher checks and unboxes each array argument of a call (about 0.1-0.15 us apiece):
# with the thirty arrays of the core a call cost ~2.5 us, and a run calls the core for every
# point-to-point send, receive and completion. So the entry points take one int64 table of
# ``(data address, rows, columns)`` per array (TABLE, in this order; NetCore._pack writes it, and
# again whenever an array is replaced by a larger one) and scalars, and view the arrays from it.
# A table of addresses rather than one buffer holding the arrays (as opkernels' H_* buffers do):
# the link state belongs to the link model (netmodel/links.py) and ``pseq`` to the per-op engine,
# which both keep using their own numpy arrays, and nothing is copied when an array grows.
#
# Views without reference counts: an array numba receives from Python carries a reference count
# that numba updates with an atomic instruction whenever a variable takes the array: at every call
# of a helper (and at every inlined one's arguments), tens per event, which took two thirds of a
# ring's time. A view made from the data pointer (carray) has no count to update. The arrays stay
# alive in NetCore for the whole call (NetCore.args holds every array the table names; they are
# replaced only between calls, when grown) and are C-contiguous with the dtype and the number of
# dimensions given below (NetCore._pack checks both).
TABLE = ("st", "heap", "msg", "mfree", "htk", "htv", "hts", "runs", "chans", "segs", "xf", "cnt", "rt", "rbw",
         "lbw", "lfree", "lwp", "lwns", "lwf", "lstat", "tstat", "khist", "tl", "pend", "rank_shard", "cseqs",
         "mseq", "outb", "pseq", "pidx", "px")  # fmt: skip
# the arrays of TABLE that are 2-D, and those of float64 (the others are int64): _views' description
TABLE_2D = frozenset(("heap", "msg", "htk", "htv", "runs", "chans", "segs", "xf", "rt", "rbw", "lwns", "lstat",
                      "tstat", "khist", "tl", "pend", "outb", "pseq", "px"))  # fmt: skip
TABLE_FLOAT = frozenset(("rbw", "lbw", "lwf"))
TABLE_COLS = 3  # a table row: data address, rows, columns (1 for a 1-D array)
(T_ST, T_HEAP, T_MSG, T_MFREE, T_HTK, T_HTV, T_HTS, T_RUNS, T_CHANS, T_SEGS, T_XF, T_CNT, T_RT, T_RBW, T_LBW, T_LFREE,
 T_LWP, T_LWNS, T_LWF, T_LSTAT, T_TSTAT, T_KHIST, T_TL, T_PEND, T_RANK_SHARD, T_CSEQS, T_MSEQ, T_OUTB, T_PSEQ, T_PIDX,
 T_PX) = range(len(TABLE))  # fmt: skip


@njit(cache=True, inline="always")
def _i1(p, i):
    """Array ``i`` of the table (1-D int64) as a view."""
    return carray(_void_ptr(p[3 * i]), p[3 * i + 1], np.int64)


@njit(cache=True, inline="always")
def _i2(p, i):
    """Array ``i`` of the table (2-D int64) as a view."""
    return carray(_void_ptr(p[3 * i]), (p[3 * i + 1], p[3 * i + 2]), np.int64)


@njit(cache=True, inline="always")
def _f1(p, i):
    return carray(_void_ptr(p[3 * i]), p[3 * i + 1], np.float64)


@njit(cache=True, inline="always")
def _f2(p, i):
    return carray(_void_ptr(p[3 * i]), (p[3 * i + 1], p[3 * i + 2]), np.float64)


@njit(cache=True, inline="always")
def _views(p):
    """The arrays of the table ``p`` (TABLE's order) as views: one description for every entry
    point (inlined: no call, and the views carry no counts to update)."""
    return (_i1(p, T_ST), _i2(p, T_HEAP), _i2(p, T_MSG), _i1(p, T_MFREE), _i2(p, T_HTK), _i2(p, T_HTV),
            _i1(p, T_HTS), _i2(p, T_RUNS), _i2(p, T_CHANS), _i2(p, T_SEGS), _i2(p, T_XF), _i1(p, T_CNT),
            _i2(p, T_RT), _f2(p, T_RBW), _f1(p, T_LBW), _i1(p, T_LFREE), _i1(p, T_LWP), _i2(p, T_LWNS),
            _f1(p, T_LWF), _i2(p, T_LSTAT), _i2(p, T_TSTAT), _i2(p, T_KHIST), _i2(p, T_TL), _i2(p, T_PEND),
            _i1(p, T_RANK_SHARD), _i1(p, T_CSEQS), _i1(p, T_MSEQ), _i2(p, T_OUTB), _i2(p, T_PSEQ), _i1(p, T_PIDX),
            _i2(p, T_PX))  # fmt: skip


# -- heap ---------------------------------------------------------------------------------------
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
    """Remove the top row; the caller has read it."""
    n = st[HEAP_N] - 1
    st[HEAP_N] = n
    if n == 0:
        return
    a0, a1, a2, a3, a4, a5 = heap[n, 0], heap[n, 1], heap[n, 2], heap[n, 3], heap[n, 4], heap[n, 5]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(heap[c + 1, 0], heap[c + 1, 1], heap[c + 1, 2], heap[c + 1, 3], heap[c + 1, 4], heap, c):
            c += 1
        if _less(a0, a1, a2, a3, a4, heap, c):
            break
        for j in range(6):
            heap[i, j] = heap[c, j]
        i = c
    heap[i, 0] = a0
    heap[i, 1] = a1
    heap[i, 2] = a2
    heap[i, 3] = a3
    heap[i, 4] = a4
    heap[i, 5] = a5


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


# -- accounting ---------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _bit_length(x):
    b = 0
    while x > 0:
        x >>= 1
        b += 1
    return b


@njit(cache=True, inline="always")
def timeline_add(tl, pend, st, tier, size, count, t, t_end, bucket):
    """ShardStats.messages' timeline rule (bytes spread pro rata over the buckets a message spans);
    rows beyond ``tl`` or at risk of int64 overflow go to ``pend`` for Python to add exactly."""
    slot = t // bucket
    single = t_end <= t or (t_end - 1) // bucket == slot
    last = slot if single else (t_end - 1) // bucket
    if last >= tl.shape[1] or (not single and size > 0 and t_end - t > (NO_LIMIT // size)):
        n = st[PEND_N]
        st[PEND_N] = n + 1
        pend[n, 0] = tier
        pend[n, 1] = size
        pend[n, 2] = count
        pend[n, 3] = t
        pend[n, 4] = t_end
        return
    if single:
        tl[tier, slot] += size * count
        return
    done = 0
    for s in range(slot, last + 1):
        part = size * (min(t_end, (s + 1) * bucket) - t) // (t_end - t) - done
        tl[tier, s] += part * count
        done += part


# -- the link model (netmodel/links.py, LinkModel: the same rules, in the same order of operations,
# so that both engines give the same figures bit for bit) ----------------------------------------
@njit(cache=True, inline="always")
def _finish(lbw, lwp, lwns, lwf, links, size, start):
    """LinkModel.finish_ns: when ``size`` bytes put on ``links`` at ``start`` have left the slowest
    of them, the pace piecewise constant between the edges of the links' slow-link windows."""
    t = start
    left = np.float64(size)
    while True:
        rate = np.inf
        edge = NO_LIMIT
        for link in links:
            f = 1.0
            for w in range(lwp[link], lwp[link + 1]):
                w_start, w_end = lwns[w, 0], lwns[w, 1]
                if w_start <= t < w_end:
                    f *= lwf[w]
                    if w_end < edge:
                        edge = w_end
                elif t < w_start < edge:
                    edge = w_start
            r = lbw[link] * f
            if r < rate:
                rate = r
        if edge >= NO_LIMIT or (edge - t) * rate >= left:
            return t + np.int64(-((-left) // rate))
        left -= (edge - t) * rate
        t = edge


@njit(cache=True, inline="always")
def _windowed(lwp, links):
    """Whether a link of ``links`` has slow-link windows (LinkModel.side_ns's test)."""
    if lwp[lwp.shape[0] - 1] == 0:
        return False
    for link in links:
        if lwp[link + 1] > lwp[link]:
            return True
    return False


@njit(cache=True, inline="always")
def _reserve(lfree, lstat, lbw, lwp, lwns, lwf, rt, rid, first, count, size, start, arrival):
    wait = start - arrival
    windows = lwp[lwp.shape[0] - 1] > 0
    for j in range(count):
        link = rt[rid, first + j]
        if windows and lwp[link + 1] > lwp[link]:
            dur = _finish(lbw, lwp, lwns, lwf, rt[rid, first + j : first + j + 1], size, start) - start
        else:
            dur = np.int64(-((-size) // lbw[link]))
        lfree[link] = start + dur
        lstat[0, link] += size
        lstat[1, link] += dur
        lstat[2, link] += 1
        if wait > lstat[3, link]:
            lstat[3, link] = wait


@njit(cache=True, inline="always")
def _queued(lstat, blocker, wait):
    """Queueing delay: a message that waited ``wait`` ns for a busy link is charged to the link
    whose free time set its start (the latest free of its route's links), once per route side."""
    if blocker >= 0:
        lstat[4, blocker] += wait
        lstat[5, blocker] += 1


# -- messages -----------------------------------------------------------------------------------
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


# nogil: a long call (a flat ring over thousands of GPUs runs for minutes in one) would otherwise hold
# the interpreter lock throughout, and netcore.prepare_kernels' thread, compiling the other kernels
# after a first run, could not progress beside it (the progress line said "compiling kernels" to the
# end). The kernels touch no Python object; the shard's thread is the only one that calls them.
@njit(cache=True, nogil=True)
def run_events(p, l0, l1, l2, l3, l4, horizon):
    """Process the core's events before ``horizon`` whose keys precede ``(l0, .., l4)`` (the
    Python heap's top); stop after an event that needs Python (STATUS) or when an array is full.
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


@njit(cache=True, nogil=True)
def start_run(p, run, t):
    """A member starts a collective at ``t``: the first step of each of its channels, in order."""
    (st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf, lstat,
     tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, pseq, pidx, _) = _views(p)  # fmt: skip
    st[STATUS] = OK
    st[ACTIVE] += 1
    lo = runs[run, R_CLO]
    for c in range(lo, lo + runs[run, R_NCH]):
        _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lwp, lwns, lwf,
              lstat, tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, c, t)  # fmt: skip
        if st[STATUS] != OK:
            break
    _set_top(st, heap)


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

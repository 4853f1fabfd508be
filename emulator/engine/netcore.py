"""The message-level collective engine, compiled with numba: the engine's hot path.

A collective expanded into messages (netmodel/collectives: channels of segments of steps) is
executed here instead of in Python: the steps of every member, the link reservations of their
messages, the hand-overs and the matching of receives. It is the same algorithm as the reference
path (:class:`~emulator.engine.collective_run.CollectiveExecution`, ``engine.collective_engine:
python``) and gives the same results bit for bit (tests/emulator/test_netcore.py), at a fraction of
CPython's cost per event: one compiled call runs every message event up to the next event that
needs Python (an operation completing, an error).

Ordering. The core keeps its own heap of ``(time, kind, rank, origin, seq, payload)`` events -
hand-overs of collective messages and collective steps - which the shard merges with its Python
heap by key. The keys are those the reference path would create: a step's ``seq`` is a per-rank
counter of steps (its relative order among the rank's steps is push order, as in the reference),
and a hand-over's ``seq`` is the sender's message counter, shared with point-to-point sends
(``mseq``), so that every key is unique across both heaps and the merged order is the reference
order.

State is a set of numpy arrays (no numba containers: unboxing those costs microseconds per call):
a binary heap, a message store with a free list, an open-addressing hash table for the mailbox and
the waiting receives, tables of runs, channels, segments and transfers (bump-allocated, reset when
no collective is active), route tables, the link state shared with the shard (``lfree``) and
statistics that :meth:`NetCore.flush` adds to the shard's :class:`~emulator.engine.stats.ShardStats`.
When an array is too small, a kernel returns ``GROW`` before touching anything and the wrapper
enlarges it.
"""

from __future__ import annotations

import array

import numpy as np
from numba import njit

from emulator.engine import events
from emulator.errors import EmulatorError
from netmodel.collectives.base import OPS

# The event kinds, as literals: numba freezes globals into cached kernels and only notices changes
# to this file, so a change in events.py must fail here rather than reorder events silently.
EV_HANDOVER, EV_STEP = 0, 1
assert (EV_HANDOVER, EV_STEP) == (events.EV_HANDOVER, events.EV_STEP), "update netcore's event kinds"
INF = events.INF

# -- scalar slots of ``st`` -------------------------------------------------------------------
(HEAP_N, EVENTS, MSG_N, MFREE_N, HT_FILL, N_RUNS, N_CHANS, N_SEGS, N_XFERS, N_CNT, ACTIVE, OUT_N,
 PEND_N, STATUS, RET_RUN, RET_T, RET_RANK, RET_PEER, RET_SIG_LO, RET_SIG_HI, FOLD, SHARD, BUCKET,
 MAXX, TOP_T, TOP_KIND, TOP_RANK, TOP_ORIGIN, TOP_SEQ, N_ST) = range(30)  # fmt: skip
OK, COMPLETE, MISMATCH, GROW = 0, 1, 2, 3
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
HT_EMPTY, HT_MSG, HT_WAITER = range(3)


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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True, inline="always")
def _reserve(lfree, lstat, lbw, rt, rid, first, count, size, start, arrival):
    wait = start - arrival
    for j in range(count):
        link = rt[rid, first + j]
        dur = np.int64(-((-size) // lbw[link]))
        lfree[link] = start + dur
        lstat[0, link] += size
        lstat[1, link] += dur
        lstat[2, link] += 1
        if wait > lstat[3, link]:
            lstat[3, link] = wait


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


@njit(cache=True)
def _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lstat, tstat, khist, tl, pend, rank_shard, mseq, outb,
            src, dst, size, rid, gid, cseq, chan, k, sig_lo, sig_hi, kind, t):  # fmt: skip
    """Put a message on the sender's up-links at ``t``; returns when its tail has left."""
    nup = rt[rid, RT_NUP]
    start = t
    for j in range(nup):
        link = rt[rid, RT_LINKS + j]
        if lfree[link] > start:
            start = lfree[link]
    _reserve(lfree, lstat, lbw, rt, rid, RT_LINKS, nup, size, start, t)
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


@njit(cache=True)
def _mismatch(st, run, rank, peer, sig_lo, sig_hi, t):
    st[STATUS] = MISMATCH
    st[RET_RUN] = run
    st[RET_RANK] = rank
    st[RET_PEER] = peer
    st[RET_SIG_LO] = sig_lo
    st[RET_SIG_HI] = sig_hi
    st[RET_T] = t


@njit(cache=True)
def _handover(st, heap, msg, mfree, htk, htv, hts, runs, chans, rt, rbw, lbw, lfree, lstat, cseqs, m, t):
    rid = msg[m, M_RID]
    size = msg[m, M_SIZE]
    nup = rt[rid, RT_NUP]
    ndown = rt[rid, RT_NDOWN]
    start = t
    for j in range(ndown):
        link = rt[rid, RT_LINKS + nup + j]
        if lfree[link] > start:
            start = lfree[link]
    _reserve(lfree, lstat, lbw, rt, rid, RT_LINKS + nup, ndown, size, start, t)
    delivery = max(msg[m, M_ENDUP] + rt[rid, RT_LAT], start + np.int64(-((-size) // rbw[rid, 1])))
    dst, src = msg[m, M_DST], msg[m, M_SRC]
    gid, cseq, chan, k = msg[m, M_GID], msg[m, M_CSEQ], msg[m, M_CHAN], msg[m, M_K]
    sig_lo, sig_hi = msg[m, M_SIG_LO], msg[m, M_SIG_HI]
    mfree[st[MFREE_N]] = m
    st[MFREE_N] += 1
    i = _ht_find(htk, hts, HT_WAITER, dst, gid, cseq, chan, src, k)
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


@njit(cache=True)
def _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lstat, tstat,
          khist, tl, pend, rank_shard, cseqs, mseq, outb, c, t):  # fmt: skip
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
        e = _inject(st, heap, msg, mfree, rt, rbw, lbw, lfree, lstat, tstat, khist, tl, pend, rank_shard, mseq,
                    outb, rank, xf[x, X_PEER], xf[x, X_SIZE], xf[x, X_RID], gid, cseq, xf[x, X_CHAN], k, sig_lo,
                    sig_hi, kind, t)  # fmt: skip
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
    """Whether every array can take what one event may add (up to MAXX messages)."""
    need = st[MAXX] + 2
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


@njit(cache=True)
def _set_top(st, heap):
    if st[HEAP_N] == 0:
        st[TOP_T] = -1
        return
    st[TOP_T] = heap[0, 0]
    st[TOP_KIND] = heap[0, 1]
    st[TOP_RANK] = heap[0, 2]
    st[TOP_ORIGIN] = heap[0, 3]
    st[TOP_SEQ] = heap[0, 4]


@njit(cache=True)
def run_events(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lstat, tstat,
               khist, tl, pend, rank_shard, cseqs, mseq, outb, l0, l1, l2, l3, l4, horizon):  # fmt: skip
    """Process the core's events before ``horizon`` whose keys precede ``(l0, .., l4)`` (the
    Python heap's top); stop after an event that needs Python (STATUS) or when an array is full."""
    st[STATUS] = OK
    while st[HEAP_N] > 0:
        if heap[0, 0] >= horizon or not _top_before(heap, l0, l1, l2, l3, l4):
            break
        if not _room(st, heap, msg, htk, outb, pend):
            st[STATUS] = GROW
            break
        t, kind, payload = heap[0, 0], heap[0, 1], heap[0, 5]
        _pop(heap, st)
        st[EVENTS] += 1
        if kind == EV_HANDOVER:
            _handover(st, heap, msg, mfree, htk, htv, hts, runs, chans, rt, rbw, lbw, lfree, lstat, cseqs, payload, t)
        else:
            _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lstat,
                  tstat, khist, tl, pend, rank_shard, cseqs, mseq, outb, payload, t)  # fmt: skip
        if st[STATUS] != OK:
            break
    _set_top(st, heap)


@njit(cache=True)
def start_run(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lstat, tstat,
              khist, tl, pend, rank_shard, cseqs, mseq, outb, run, t):  # fmt: skip
    """A member starts a collective at ``t``: the first step of each of its channels, in order."""
    st[STATUS] = OK
    st[ACTIVE] += 1
    lo = runs[run, R_CLO]
    for c in range(lo, lo + runs[run, R_NCH]):
        _step(st, heap, msg, mfree, htk, htv, hts, runs, chans, segs, xf, cnt, rt, rbw, lbw, lfree, lstat, tstat,
              khist, tl, pend, rank_shard, cseqs, mseq, outb, c, t)  # fmt: skip
        if st[STATUS] != OK:
            break
    _set_top(st, heap)


@njit(cache=True)
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


KIND_INDEX = {name: i for i, name in enumerate(OPS)}
_ARRAYS = ("st", "heap", "msg", "mfree", "htk", "htv", "hts", "runs", "chans", "segs", "xf", "cnt", "rt", "rbw",
           "lbw", "lfree", "lstat", "tstat", "khist", "tl", "pend", "rank_shard", "cseqs", "mseq", "outb")  # fmt: skip


class NetCore:
    """One shard's compiled collective engine: its arrays and the calls the shard makes."""

    # first sizes of the growable arrays (rows); a test starts from tiny ones to exercise growth
    INITIAL = {"heap": 1024, "msg": 1024, "ht": 4096, "runs": 64, "chans": 64, "segs": 64, "xf": 128,
               "cnt": 128, "rt": 64, "tl": 1024, "pend": 64, "outb": 256}  # fmt: skip

    def __init__(self, topo, shard_index: int, rank_shard, fold: int, stats):
        self.topo = topo
        self.stats = stats  # the shard's ShardStats, which flush() adds to
        bucket_ns = stats.bucket_ns
        i64 = np.int64
        n_links, tiers, world = len(topo.link_bw), len(topo.tier_names), topo.world_size
        self.max_links = max(1, tiers)  # links of a route on one side: the NIC and one per tier above
        self.st = np.zeros(N_ST, i64)
        self.st[FOLD], self.st[SHARD], self.st[BUCKET] = fold, shard_index, bucket_ns
        size = self.INITIAL
        assert size["ht"] & (size["ht"] - 1) == 0, "the hash table's size is a power of two"
        self.heap = np.zeros((size["heap"], 6), i64)
        self.msg = np.zeros((size["msg"], 13), i64)
        self.mfree = np.zeros(size["msg"], i64)
        self.htk = np.zeros((size["ht"], 6), i64)
        self.htv = np.zeros((size["ht"], 4), i64)
        self.hts = np.zeros(size["ht"], i64)
        self.runs = np.zeros((size["runs"], 11), i64)
        self.chans = np.zeros((size["chans"], 7), i64)
        self.segs = np.zeros((size["segs"], 5), i64)
        self.xf = np.zeros((size["xf"], 5), i64)
        self.cnt = np.zeros(size["cnt"], i64)
        self.rt = np.zeros((size["rt"], RT_LINKS + 2 * self.max_links), i64)
        self.rbw = np.zeros((size["rt"], 2), np.float64)
        self.lbw = np.array(topo.link_bw, np.float64)
        # link state and message counters are shared with the shard's Python paths: one buffer,
        # seen by the kernels as numpy arrays and by Python as array.array (whose indexing costs a
        # quarter of numpy's element access)
        self.lfree_py = array.array("q", bytes(8 * n_links))
        self.lfree = np.frombuffer(self.lfree_py, dtype=i64)
        self.lstat = np.zeros((4, n_links), i64)  # bytes, busy ns, messages, max wait ns
        self.tstat = np.zeros((tiers, 2 + HIST), i64)  # bytes, messages, size histogram
        self.khist = np.zeros((len(OPS), HIST), i64)
        self.tl = np.zeros((tiers, size["tl"]), i64)
        self.pend = np.zeros((size["pend"], 5), i64)
        self.rank_shard = np.array(rank_shard, i64)
        self.cseqs = np.zeros(world, i64)  # per-rank step counter (part of step keys)
        self.mseq_py = array.array("q", bytes(8 * world))  # per-sender message counter (point-to-point too)
        self.mseq = np.frombuffer(self.mseq_py, dtype=i64)
        self.outb = np.zeros((size["outb"], 14), i64)
        self._rids: dict[tuple[int, int], int] = {}
        self._templates: dict[tuple, tuple] = {}
        self.ops: dict[int, tuple] = {}  # active run -> (gpu, op)
        self.top = INF  # time of the core's next event
        self._pack()

    def _pack(self) -> None:
        self.args = tuple(getattr(self, name) for name in _ARRAYS)

    # -- state read by the shard ------------------------------------------------------------
    @property
    def events(self) -> int:
        return int(self.st[EVENTS])

    def _read_top(self) -> None:
        """Refresh ``top`` (read by the shard's loop for every event: a plain attribute)."""
        t = self.st.item(TOP_T)
        if t >= NO_LIMIT:
            # the kernels' int64 arithmetic (and the horizon sentinel) end here
            raise EmulatorError(f"virtual time reached {t} ns (over 2^62 ns, 146 years): beyond what the "
                                f"engine represents; check the sizes and bandwidths of this run")  # fmt: skip
        self.top = t if t >= 0 else INF

    def has_outbox(self) -> bool:
        return bool(self.st[OUT_N])

    def top_key(self) -> tuple:
        st = self.st
        return int(st[TOP_T]), int(st[TOP_KIND]), int(st[TOP_RANK]), int(st[TOP_ORIGIN]), int(st[TOP_SEQ])

    # -- routes -------------------------------------------------------------------------------
    def rid(self, src: int, dst: int) -> int:
        key = (src, dst)
        rid = self._rids.get(key)
        if rid is None:
            route = self.topo.route(src, dst)
            rid = len(self._rids)
            if rid == self.rt.shape[0]:
                self.rt = _grown(self.rt, 2 * rid)
                self.rbw = _grown(self.rbw, 2 * rid)
                self._pack()
            row = self.rt[rid]
            row[RT_TIER], row[RT_LAT], row[RT_NUP], row[RT_NDOWN] = (
                route.tier, route.latency_ns, len(route.up), len(route.down))  # fmt: skip
            assert len(route.up) <= self.max_links and len(route.down) <= self.max_links, route
            row[RT_LINKS : RT_LINKS + len(route.up)] = route.up
            row[RT_LINKS + len(route.up) : RT_LINKS + len(route.up) + len(route.down)] = route.down
            self.rbw[rid] = (route.up_bw, route.down_bw)
            self._rids[key] = rid
        return rid

    # -- collectives --------------------------------------------------------------------------
    def _template(self, rank: int, op) -> tuple:
        """Rows of a member's call (channels, segments, transfers, counters), cached per call."""
        key = (id(op.a), op.b.name)
        cached = self._templates.get(key)
        if cached is not None and cached[0] is op.a:
            return cached[1]
        chans, segs, xfs, slots, maxx = [], [], [], {}, 0
        for channel in op.b.segments(op.a, self.topo):
            first = len(segs)
            for sends, recvs, repeat in channel:
                s_lo = len(xfs)
                for peer, size, chan in sends:
                    xfs.append((peer, size, chan, self.rid(rank, peer), slots.setdefault((0, peer, chan), len(slots))))
                r_lo = len(xfs)
                for peer, size, chan in recvs:
                    xfs.append((peer, size, chan, -1, slots.setdefault((1, peer, chan), len(slots))))
                segs.append((s_lo, len(sends), r_lo, len(recvs), repeat))
                maxx = max(maxx, len(sends), len(recvs))
            chans.append((first, len(segs), segs[first][4] if len(segs) > first else 0))
        template = (
            np.array(chans, np.int64).reshape(-1, 3),
            np.array(segs, np.int64).reshape(-1, 5),
            np.array(xfs, np.int64).reshape(-1, 5),
            len(slots),
            maxx,
        )
        self._templates[key] = (op.a, template)
        return template

    def start(self, gpu, op, t: int) -> int:
        """Start ``op`` (a collective) for ``gpu`` at ``t``; returns the kernel status, or -1 when
        the call has no channels (the shard completes it at once)."""
        chans_t, segs_t, xf_t, n_cnt, maxx = self._template(gpu.rank, op)
        if not len(chans_t):
            return -1
        st = self.st
        if maxx > st[MAXX]:
            st[MAXX] = maxx
        run, c0, s0, x0, k0 = (int(v) for v in st[[N_RUNS, N_CHANS, N_SEGS, N_XFERS, N_CNT]])
        nch, nseg, nx = len(chans_t), len(segs_t), len(xf_t)
        self._ensure(run + 1, c0 + nch, s0 + nseg, x0 + nx, k0 + n_cnt, nch * (int(st[MAXX]) + 2))
        st[N_RUNS], st[N_CHANS], st[N_SEGS], st[N_XFERS], st[N_CNT] = run + 1, c0 + nch, s0 + nseg, x0 + nx, k0 + n_cnt
        gid, cseq = op.c
        self.runs[run] = (gid, cseq, op.d & SIG_MASK, op.d >> SIG_BITS, nch, 0, gpu.rank, KIND_INDEX[op.a.op],
                          c0, nch, k0)  # fmt: skip
        chans = self.chans[c0 : c0 + nch]
        chans[:, C_RUN] = run
        chans[:, C_SEG] = chans_t[:, 0] + s0
        chans[:, C_SEG_END] = chans_t[:, 1] + s0
        chans[:, C_REP] = chans_t[:, 2]
        chans[:, C_PENDING] = 0
        chans[:, C_TEND] = 0
        chans[:, C_RANK] = gpu.rank
        segs = self.segs[s0 : s0 + nseg]
        segs[:] = segs_t
        segs[:, S_SLO] += x0
        segs[:, S_RLO] += x0
        self.xf[x0 : x0 + nx] = xf_t
        self.cnt[k0 : k0 + n_cnt] = 0
        self.ops[run] = (gpu, op)
        start_run(*self.args, run, t)
        self._read_top()
        return st.item(STATUS)

    def run(self, limit: tuple | None, horizon: int) -> int:
        """Process events before ``limit`` (a Python heap key) and ``horizon``; returns the status."""
        if limit is None:
            run_events(*self.args, NO_LIMIT, 0, 0, 0, 0, horizon)
        else:
            run_events(*self.args, limit[0], limit[1], limit[2], limit[3], limit[4], horizon)
        self._read_top()
        status = self.st.item(STATUS)
        if status == GROW:
            self._ensure(0, 0, 0, 0, 0, int(self.st[MAXX]) + 2)
        return status

    def finished(self) -> tuple:
        """The run that the last call completed: ``(gpu, op, t)``."""
        st = self.st
        gpu, op = self.ops.pop(int(st[RET_RUN]))
        return gpu, op, int(st[RET_T])

    def reset_if_idle(self) -> None:
        """No collective in progress: reuse the tables from the start (they only grow otherwise)."""
        st = self.st
        if st[ACTIVE] == 0 and st[N_RUNS]:
            assert not self.ops
            st[N_RUNS] = st[N_CHANS] = st[N_SEGS] = st[N_XFERS] = st[N_CNT] = 0

    def mismatch(self) -> tuple:
        """``(gpu, op, peer, peer_sig, t)`` of the mismatch the last call found."""
        st = self.st
        gpu, op = self.ops[int(st[RET_RUN])]
        sig = int(st[RET_SIG_LO]) | int(st[RET_SIG_HI]) << SIG_BITS
        return gpu, op, int(st[RET_PEER]), sig, int(st[RET_T])

    def waiting_peers(self, rank: int, op) -> list[int]:
        """Peers whose messages ``op`` (a started collective of ``rank``) is waiting for."""
        runs = [r for r, (_, o) in self.ops.items() if o is op]
        waiting = (self.hts == HT_WAITER) & (self.htk[:, 0] == rank)
        idx = np.nonzero(waiting)[0]
        return sorted({int(self.htk[i, 4]) for i in idx if int(self.chans[self.htv[i, 0], C_RUN]) in runs})

    # -- cross-shard messages -----------------------------------------------------------------
    def deliver(self, records: list) -> None:
        """Collective messages from other shards (outbox tuples)."""
        recs = np.array([(*r[:10], r[10] & SIG_MASK, r[10] >> SIG_BITS) for r in records], np.int64)
        rids = np.array([self.rid(r[2], r[1]) for r in records], np.int64)
        need = int(self.st[HEAP_N]) + len(records) + 2
        self._ensure(0, 0, 0, 0, 0, len(records) + 2)
        assert self.heap.shape[0] >= need
        deliver_records(self.st, self.heap, self.msg, self.mfree, recs, rids)
        self._read_top()

    def take_outbox(self, outbox: dict[int, list]) -> None:
        """Move the core's cross-shard messages into the shard's ``outbox`` (shard -> records)."""
        n = int(self.st[OUT_N])
        if not n:
            return
        for row in self.outb[:n].tolist():
            outbox.setdefault(row[13], []).append((*row[:10], row[10] | row[11] << SIG_BITS))
        self.st[OUT_N] = 0

    # -- statistics ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Add the core's accounting to the shard's ShardStats and clear it."""
        stats, lstat = self.stats, self.lstat
        for link in np.nonzero(lstat[2])[0].tolist():
            nbytes, busy, messages, wait = (int(v) for v in lstat[:, link])
            stats.link_bytes[link] += nbytes
            stats.link_busy_ns[link] += busy
            stats.link_messages[link] += messages
            if wait > stats.link_max_wait_ns[link]:
                stats.link_max_wait_ns[link] = wait
        lstat[:] = 0
        for tier, row in enumerate(self.tstat.tolist()):
            if not row[1]:
                continue
            stats.tier_bytes[tier] += row[0]
            stats.tier_messages[tier] += row[1]
            hist = stats.size_hist[tier]
            for b, count in enumerate(row[2:]):
                if count:
                    hist[b] = hist.get(b, 0) + count
        self.tstat[:] = 0
        for kind, row in enumerate(self.khist.tolist()):
            if not any(row):
                continue
            hist = stats.kind_hist.setdefault(OPS[kind], {})
            for b, count in enumerate(row):
                if count:
                    hist[b] = hist.get(b, 0) + count
        self.khist[:] = 0
        for tier in range(self.tl.shape[0]):
            line = stats.timeline[tier]
            row = self.tl[tier]
            for slot in np.nonzero(row)[0].tolist():
                line[slot] = line.get(slot, 0) + int(row[slot])
        self.tl[:] = 0
        self._flush_pending()

    def _flush_pending(self) -> None:
        n = int(self.st[PEND_N])
        for tier, size, count, t, t_end in self.pend[:n].tolist():
            self.stats.timeline_add(tier, size, count, t, t_end)
        self.st[PEND_N] = 0

    # -- capacity -----------------------------------------------------------------------------
    def _ensure(self, runs: int, chans: int, segs: int, xfs: int, cnts: int, per_event: int) -> None:
        """Grow whatever cannot take the given table sizes plus ``per_event`` more messages."""
        st, grown = self.st, False
        for name, need in (("runs", runs), ("chans", chans), ("segs", segs), ("xf", xfs), ("cnt", cnts),
                           ("heap", int(st[HEAP_N]) + per_event), ("outb", int(st[OUT_N]) + per_event)):  # fmt: skip
            arr = getattr(self, name)
            if need > arr.shape[0]:
                setattr(self, name, _grown(arr, max(need, 2 * arr.shape[0])))
                grown = True
        if int(st[MSG_N]) + per_event > self.msg.shape[0]:
            size = max(int(st[MSG_N]) + per_event, 2 * self.msg.shape[0])
            self.msg, self.mfree = _grown(self.msg, size), _grown(self.mfree, size)
            grown = True
        if int(st[PEND_N]) + per_event > self.pend.shape[0]:
            # timeline rows beyond the array: widen it to the latest slot seen (within reason) and
            # hand the rows to the shard's statistics, which add them exactly
            n = int(st[PEND_N])
            last = (int(self.pend[:n, 4].max(initial=1)) - 1) // int(st[BUCKET])
            if self.tl.shape[1] <= last < TIMELINE_MAX_SLOTS:
                tl = np.zeros((self.tl.shape[0], max(last + 1, 2 * self.tl.shape[1])), np.int64)
                tl[:, : self.tl.shape[1]] = self.tl
                self.tl = tl
            self._flush_pending()
            if per_event > self.pend.shape[0]:
                self.pend = _grown(self.pend, 2 * per_event)
            grown = True
        if 2 * (int(st[HT_FILL]) + per_event) > self.htk.shape[0]:
            size = 2 * self.htk.shape[0]
            while 2 * (int(st[HT_FILL]) + per_event) > size:
                size *= 2
            nk, nv, ns = np.zeros((size, 6), np.int64), np.zeros((size, 4), np.int64), np.zeros(size, np.int64)
            rehash(self.htk, self.htv, self.hts, nk, nv, ns, st)
            self.htk, self.htv, self.hts = nk, nv, ns
            grown = True
        if grown:
            self._pack()


def _grown(arr: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *arr.shape[1:]), arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def warm_up() -> None:
    """Load every kernel (compiled on first use, then from numba's cache in ``__pycache__``): the
    first call of each costs ~0.3 s; benchmarks call this before starting their clocks."""
    from emulator.config.schema import ClusterConfig
    from emulator.engine.stats import ShardStats
    from netmodel.topology import Topology

    topo = Topology(ClusterConfig())
    core = NetCore(topo, 0, [0] * topo.world_size, 1, ShardStats(topo))
    run_events(*core.args, 0, 0, 0, 0, 0, 0)
    start_run(*core.args, 0, 0)  # a run without channels
    core.st[ACTIVE] = 0
    deliver_records(core.st, core.heap, core.msg, core.mfree, np.zeros((0, 12), np.int64), np.zeros(0, np.int64))
    rehash(core.htk, core.htv, core.hts, core.htk.copy(), core.htv.copy(), core.hts.copy(), core.st)
    timeline_add(core.tl, core.pend, core.st, 0, 1, 1, 0, 1, 1000)


"""The message core's arrays, as the kernels see them (netkernels.py and the modules it is split into).

State is a set of numpy arrays (no numba containers: unboxing those costs microseconds per call):
a binary heap (netheap.py), a message store with a free list, an open-addressing hash table for the
mailbox and the waiting receives (netmailbox.py), tables of runs, channels, segments and transfers,
route tables, the link state shared with the shard (``lfree``; netlinks.py) and statistics
(netstats.py). This module names them: the scalar slots of ``st``, the statuses a kernel returns
there, the columns of each table, and the one table of the arrays' addresses that every entry point
takes. A kernel that could overflow an array returns ``GROW`` before touching anything (see
netkernels._room); the caller enlarges the arrays.

The address-to-pointer intrinsic comes from kernel_memory.py, shared with the op kernels; numba's
cache notices changes to a function's own file only, so kernel_cache.py stamps every kernel file
with all of them (an edit of this file recompiles every kernel that reads its constants).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import events, kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.kernel_memory import void_ptr as _void_ptr

# The event kinds, as literals: numba freezes globals into cached kernels (kernel_cache.py's stamp
# recompiles them after an edit of events.py), and a change there must fail here rather than
# reorder events silently.
EV_HANDOVER, EV_STEP, EV_OP_DONE = 0, 1, 2
assert (EV_HANDOVER, EV_STEP, EV_OP_DONE) == (events.EV_HANDOVER, events.EV_STEP, events.EV_OP_DONE), (
    "update netlayout's event kinds")

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
# a collective call's template (NetCore._template, netkernels.start_call), one int64 array: its
# channels, segments, transfers, message counters, widest step and kind, then TP_HDR on, each
# channel's (first segment, end segment, repeats of the first), each segment's S_* row and each
# transfer's X_* row (segments and transfers numbered from the call's own first)
TP_NCH, TP_NSEG, TP_NX, TP_NCNT, TP_MAXX, TP_KIND, TP_HDR = range(7)
# HT_RECV: a point-to-point receive waiting (values: its id, its size, its start time)
HT_EMPTY, HT_MSG, HT_WAITER, HT_RECV = range(4)
SEND_KIND = 7  # the khist row of point-to-point sends: after netmodel's OPS (netcore checks it)
SEND_ROOM = 16  # messages the arrays keep free after any call (_room; oplayout.NET_LOW)


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

"""The layout of the compiled per-op engine's arrays (split from opkernels.py, whose module doc
describes the state): the columns of the rank rows (``R_*``, a stream slot's ``SS_*``), op rows
(``O_*``), plans (``P_*``), tensor groups (``GR_*``), sends' descriptors (``SD_*``) and globals
(``G_*``), the op kinds, states and template codes, the statuses (``ST_*``), the packed buffers'
headers (``H_*``) and the table of array addresses (``A_*``) every kernel takes, with the views
that cut an array out of it (``_i2``, ``_i1``, ``_f1``) or out of the packed buffers (``_packed``).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.kernel_memory import void_ptr as _void_ptr
from emulator.engine.netkernels import TABLE as _NET_TABLE
from emulator.engine.netlayout import RECV_MISMATCH as _RECV_MISMATCH

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
# G_KRECVS: the tapes' receives completed inside the message core's run (opkernels.run_net), over the
# run (tests count them); G_KRECV_T: when the last one of the latest run_net call completed (-1: none)
G_KRECVS, G_KRECV_T = 20, 21
G_FIELDS = 22
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
# run_net's return where a tape's receive it completed leaves Python something to do (its status
# not ST_LIMIT, an error, the timeline's overflow, the message core's room, a drained receive stream):
# after the message core's statuses (netlayout: OK .. RECV_MISMATCH), which run_net returns as they are
NET_KRECV = 6
assert NET_KRECV > _RECV_MISMATCH, "run_net's status follows the message core's"
# (inside the kernels only: an instant op ended its block and the next block started behind it,
# _instant's chain - the compute stream's loop goes on with that block's first op)
ST_ICHAIN = 11
# The packed buffers (OpCore._pack_*): numba's dispatcher checks and unboxes each array argument of
# a call, about 0.15 us apiece (2.6 us a call with the 14 arrays these kernels use), and a run makes
# a kernel call every two or three events; so the kernels' arrays live in five buffers and the entry
# points cut the arrays out of them. ``ib`` (int64, fixed size) and ``gb`` (int64, grown: the templates,
# plans and timeline) start with a header of ``(offset, rows)`` pairs, ``fb`` (float64, fixed) is laid
# out by ``ib``'s header; ``tf`` (the templates' FLOPs), ``free`` (the link model's array) and ``net``
# (the message core's table, netkernels.TABLE) are taken whole.
# Even six array arguments took 0.5 us of a call's dispatch more than ints do (a call of launch_step,
# the most frequent, costs 2 us in all): so an entry point takes one int, the address of the call
# table, an int64 array of the six buffers' addresses (C_*: OpCore._pack writes it, again whenever
# ``gb`` or ``tf`` is replaced; OpCore holds the buffers, alive as long as the table names them).
C_IB, C_GB, C_FB, C_TF, C_FREE, C_NET = range(6)
CALL_FIELDS = 6
H_RS, H_OPS, H_HEAP, H_G, H_QN, H_QM, H_OVF, H_GR, H_OF, H_RF = range(0, 20, 2)
IB_HEADER = 20
H_TI, H_TP, H_PL, H_PLK, H_TL, H_SD, H_KC = range(0, 14, 2)
GB_HEADER = 14

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
def _packed(call):
    """The table of the arrays (A_*) from the call table at address ``call`` (C_*): the packed
    buffers' arrays where their headers place them, then the kernel sends' (A_SD, A_KC) and the
    message core's table (A_NET); one description of the unpacking for every entry point."""
    c = carray(_void_ptr(call), CALL_FIELDS, np.int64)
    ib, gb, fb = c[C_IB], c[C_GB], c[C_FB]
    ih = carray(_void_ptr(ib), IB_HEADER, np.int64)
    gh = carray(_void_ptr(gb), GB_HEADER, np.int64)
    return (ib + ih[H_RS] * 8, ib + ih[H_OPS] * 8, fb + ih[H_OF] * 8, fb + ih[H_RF] * 8, gb + gh[H_TI] * 8,
            c[C_TF], gb + gh[H_TP] * 8, gb + gh[H_PL] * 8, gb + gh[H_PLK] * 8, c[C_FREE], ib + ih[H_QN] * 8,
            ib + ih[H_QM] * 8, gb + gh[H_TL] * 8, ib + ih[H_OVF] * 8, ib + ih[H_HEAP] * 8, ib + ih[H_G] * 8,
            ib + ih[H_GR] * 8, gh[H_TL + 1], ih[H_OVF + 1], gb + gh[H_SD] * 8, gb + gh[H_KC] * 8,
            c[C_NET])  # fmt: skip

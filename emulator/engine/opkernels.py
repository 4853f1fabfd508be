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

The kernels are split by what they model: oplayout.py names the arrays (the rank, op, plan and
global columns, the statuses, the packed buffers and the table of addresses every kernel takes),
opheap.py is the event heap and the op ring, opsends.py a tape's pipeline sends and receives,
opstreams.py a block's compute and tensor streams and oploop.py the event loop. This module holds
the entry points Python calls and re-exports the names the other modules and the tests take from it
(``__all__``). The modules call each other in one direction only (layout <- heap <- sends <-
streams <- loop <- here): numba compiles kernels that call each other in a cycle but crashes
loading them from its cache.
"""

from __future__ import annotations

from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)
from emulator.engine.opheap import (
    _new_op,
    _pop,
    _push,
)
from emulator.engine.oplayout import (
    _NET_TABLE,
    A_G,
    A_GR,
    A_NOVF,
    A_NTL,
    A_RS,
    G_BUCKET,
    G_ERR,
    G_EVENTS,
    G_FIELDS,
    G_HEAPN,
    G_KRECV_T,
    G_KRECVS,
    G_LOW,
    G_MAXAHEAD,
    G_NET,
    G_NOVF,
    G_PREL,
    G_RDRAIN,
    G_RDRAIN_RI,
    G_RDRAIN_T,
    G_RET_OP,
    G_RET_RI,
    G_RET_T,
    G_RET_TSTART,
    G_RING,
    G_SENT,
    G_SS,
    G_STATUS,
    GB_HEADER,
    GR_FIELDS,
    GR_MEM0,
    GR_N,
    H_G,
    H_GR,
    H_HEAP,
    H_KC,
    H_OF,
    H_OPS,
    H_OVF,
    H_PL,
    H_PLK,
    H_QM,
    H_QN,
    H_RF,
    H_RS,
    H_SD,
    H_TI,
    H_TL,
    H_TP,
    I_A,
    I_C,
    I_F,
    I_M,
    I_W,
    IB_HEADER,
    K_C,
    K_M,
    K_R,
    MAX_DEPS,
    MAX_MEMBERS,
    MAX_WAITS,
    NET_KRECV,
    NO_LIMIT,
    NSS,
    O_DEP0,
    O_DEPS,
    O_FIELDS,
    O_GATE,
    O_KIND,
    O_LOST,
    O_NDEP,
    O_NEXT,
    O_RI,
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
    R_CAP,
    R_CBLK,
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
    R_RING,
    R_RPEND,
    R_SEQ,
    R_SS0,
    R_SUSP,
    R_SYNC,
    R_TBLK,
    R_THEAD,
    R_TTAIL,
    R_WCT,
    R_WCT_HIT,
    R_WTC,
    R_WTC_HIT,
    RANK_BITS,
    S_DONE,
    S_LAUNCHED,
    S_STARTED,
    SD_CTR,
    SD_DST,
    SD_FIELDS,
    SD_RECV,
    SD_TAG,
    SEQ_BITS,
    SEQ_LIMIT,
    SEQ_MASK,
    SS_BLK,
    SS_CHIT,
    SS_CWAIT,
    SS_FIELDS,
    SS_HEAD,
    SS_HIT,
    SS_SEAL,
    SS_TAIL,
    SS_WAIT,
    ST_BLOCK_DONE,
    ST_IBLOCK,
    ST_IRESUME,
    ST_LAUNCHED,
    ST_LIMIT,
    ST_OOM,
    ST_RESUME,
    ST_RMISMATCH,
    ST_SDRAIN,
    ST_STEPPED,
    ST_SUSPEND,
    _i1,
    _i2,
    _packed,
    _table,
)
from emulator.engine.oploop import (
    _complete_recv,
    _run,
    _run_at,
    _run_net_at,
)
from emulator.engine.opsends import (
    _launch_recv,
    _launch_send,
    _note_room,
)
from emulator.engine.opstreams import (
    _begin_pending,
    _launch_rest,
    _start,
    _start_block,
    _timeline,
    _try_c,
)

# the names other modules and the tests take from here (tests/emulator/engine/test_kernel_cache.py)
__all__ = [
    "A_GR", "A_NOVF", "A_NTL", "GB_HEADER", "GR_FIELDS", "GR_MEM0", "GR_N", "G_BUCKET", "G_ERR", "G_EVENTS",
    "G_FIELDS", "G_HEAPN", "G_KRECV_T", "G_KRECVS", "G_LOW", "G_MAXAHEAD", "G_NET", "G_NOVF", "G_PREL", "G_RDRAIN",
    "G_RDRAIN_RI", "G_RDRAIN_T", "G_RET_OP", "G_RET_RI", "G_RET_T", "G_RET_TSTART", "G_RING", "G_SENT", "G_SS",
    "G_STATUS", "H_G", "H_GR", "H_HEAP", "H_KC", "H_OF", "H_OPS", "H_OVF", "H_PL", "H_PLK", "H_QM", "H_QN", "H_RF",
    "H_RS", "H_SD", "H_TI", "H_TL", "H_TP", "IB_HEADER", "I_A", "I_C", "I_F", "I_M", "I_W", "K_C", "K_M", "K_R",
    "MAX_DEPS", "MAX_MEMBERS", "MAX_WAITS", "NET_KRECV", "NO_LIMIT", "NSS", "O_DEP0", "O_DEPS", "O_FIELDS", "O_GATE",
    "O_KIND", "O_LOST", "O_NDEP", "O_NEXT", "O_RI", "O_STATE", "O_TSTART", "O_VAL", "P_ARRIVALS", "P_CALLS",
    "P_CCOUNT", "P_CNS", "P_DUR", "P_FIELDS", "P_GROUP", "P_LLEN", "P_LPTR", "P_MAXWAIT", "P_MEMBERS", "P_MSGB",
    "P_MSGS", "P_SIG", "RANK_BITS", "R_ADONE", "R_ASTART", "R_AUTO", "R_BEGIN", "R_BPOS", "R_CAP", "R_CBLK",
    "R_CHEAD", "R_CNS", "R_COMMNS", "R_CTAIL", "R_FIELDS", "R_LAST", "R_LASTC", "R_LOST", "R_MEM", "R_NWAIT",
    "R_OPSDONE", "R_OUT", "R_PEAK", "R_PEND", "R_RANK", "R_RING", "R_RPEND", "R_SEQ", "R_SS0", "R_SUSP", "R_SYNC",
    "R_TBLK", "R_THEAD", "R_TTAIL", "R_WCT", "R_WCT_HIT", "R_WTC", "R_WTC_HIT", "SD_CTR", "SD_DST", "SD_FIELDS",
    "SD_RECV", "SD_TAG", "SEQ_BITS", "SEQ_LIMIT", "SEQ_MASK", "SS_BLK", "SS_CHIT", "SS_CWAIT", "SS_FIELDS", "SS_HEAD",
    "SS_HIT", "SS_SEAL", "SS_TAIL", "SS_WAIT", "ST_BLOCK_DONE", "ST_IBLOCK", "ST_IRESUME", "ST_LAUNCHED", "ST_LIMIT",
    "ST_OOM", "ST_RESUME", "ST_RMISMATCH", "ST_SDRAIN", "ST_STEPPED", "ST_SUSPEND", "S_DONE", "S_LAUNCHED",
    "S_STARTED", "_NET_TABLE", "_new_op", "_pop", "_push", "_run", "_start", "_table", "_timeline", "complete_recv",
    "cont", "launch_recv", "launch_rest", "launch_send", "launch_step", "launch_steps", "run", "run_net", "start_block",
]  # fmt: skip


@njit(cache=True)
def launch_rest(call, ri, now):
    P = _packed(call)
    _begin_pending(P, ri)
    _launch_rest(P, ri, now)
    _note_room(P)


@njit(cache=True)
def start_block(call, ri, t):
    P = _packed(call)
    _begin_pending(P, ri)
    _start_block(P, ri, t)
    _note_room(P)


@njit(cache=True)
def cont(call, ri, t):
    """The compute stream's loop (Shard._try_start) goes on at ``t`` after an ST_IRESUME."""
    P = _packed(call)
    g = _i1(P, A_G)
    g[G_STATUS] = _try_c(P, ri, t)
    _note_room(P)


@njit(cache=True)
def run(call, lt, lk, lr, lo, ls, horizon):
    P = _packed(call)
    _run_at(P, lt, lk, lr, lo, ls, horizon)
    _note_room(P)


@njit(cache=True)
def launch_recv(call, ri, d, size, dep, now):
    """:func:`_launch_recv` alone (OpCore.launch_recv). Status ST_LIMIT, or ST_RMISMATCH."""
    P = _packed(call)
    g = _i1(P, A_G)
    g[G_STATUS] = _launch_recv(P, ri, d, size, dep, now)
    _note_room(P)


@njit(cache=True)
def complete_recv(call, op, t):
    """A kernel receive completes at its hand-over's event (the message core's RECV_DONE): as
    Shard._complete; the status of _recv_rest (an instant op's, ST_RESUME, ST_LIMIT)."""
    _complete_recv(_packed(call), op, t)


@njit(cache=True)
def run_net(call, lt, lk, lr, lo, ls, horizon):
    """The message core's run (netkernels.run_events, NetCore.run) with the tapes' receives it
    completes completed in the same call (:func:`oploop._run_net_at`; EMULATOR_TAPE=steps and
    blocks, one shard): its status, or NET_KRECV where Python goes on after such a receive."""
    return _run_net_at(_packed(call), lt, lk, lr, lo, ls, horizon)


@njit(cache=True)
def launch_send(call, ri, d, size, dep, now):
    """:func:`_launch_send` alone (a send after a step the kernels did not launch, OpCore.launch_send)."""
    P = _packed(call)
    _launch_send(P, ri, d, size, dep, now)
    g = _i1(P, A_G)
    g[G_STATUS] = ST_LIMIT
    _note_room(P)


@njit(cache=True)
def launch_step(call, ri, now, d, size, dep, rd, rsize):
    """A tape step's block launched to its end, then its send (descriptor ``d`` >= 0) and the next
    step's receive (``rd`` >= 0), in one call (tape.py's phases 2, 3 and the next step's 0;
    OpCore.launch_step): :func:`launch_rest`; where it returns ST_LAUNCHED (no instant op stopped
    it, the program need not suspend first: no Python runs between these launches)
    :func:`_launch_send` (after the block: ``dep``), and unless the program must suspend after it
    (Shard.launch's check) :func:`_launch_recv`, after the block too (it cannot start before the
    block's end: no mismatch here), status ST_STEPPED; else launch_rest's status (ST_LAUNCHED:
    the send was launched, not the receive)."""
    P = _packed(call)
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


@njit(cache=True)
def launch_steps(call, ri, now, st, n):
    """Steps ``st[0:n]`` of a tape (``st[s] = (block, d, size, rd, rsize)``: the block's template,
    its send's descriptor and size, the next step's receive's; EMULATOR_TAPE=arrays,
    OpCore.launch_steps) launched in one call, each as the per-step calls would launch it: its
    proxy's part (R_BEGIN, R_AUTO 1, one more outstanding op: Shard._launch_block_compiled, whose
    chain conditions the caller checked for the first, and which each later one meets behind the
    block before it), then :func:`launch_step`'s. A step is launched only where the program would
    not be suspended after its proxy (Shard.launch's check); the call goes on to the next only
    where this one ended as a step whose Python after the call has nothing to do (ST_STEPPED, no
    flag for OpCore._after, the program not to be suspended). Returns how many steps it launched
    (0: none); G_STATUS is the last one's (launch_step's)."""
    P = _packed(call)
    rs = _i2(P, A_RS, R_FIELDS)
    g = _i1(P, A_G)
    max_ahead = g[G_MAXAHEAD]
    for s in range(n):
        if rs[ri, R_OUT] + 1 >= max_ahead or rs[ri, R_SUSP]:
            return s  # (the program is suspended after this step's proxy: the per-step path's)
        rs[ri, R_BEGIN] = st[s, 0]
        rs[ri, R_AUTO] = 1
        rs[ri, R_OUT] += 1
        _begin_pending(P, ri)
        _launch_rest(P, ri, now)
        if g[G_STATUS] == ST_LAUNCHED:
            _launch_send(P, ri, st[s, 1], st[s, 2], 1, now)
            if rs[ri, R_OUT] < max_ahead and not rs[ri, R_SUSP]:
                _launch_recv(P, ri, st[s, 3], st[s, 4], 1, now)
                g[G_STATUS] = ST_STEPPED
        _note_room(P)
        if (g[G_STATUS] != ST_STEPPED or g[G_ERR] or g[G_NOVF] or g[G_SENT] or g[G_LOW] or g[G_RDRAIN]
                or rs[ri, R_OUT] >= max_ahead):
            return s + 1
    return n

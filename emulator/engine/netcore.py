"""The shard's side of the compiled collective engine: :class:`NetCore` owns the arrays the
kernels (emulator/engine/netkernels.py) work on, turns a collective call into their rows, grows
them on request, moves cross-shard messages in and out and adds the kernels' accounting to the
shard's :class:`~emulator.engine.stats.ShardStats`.

The run tables (runs, channels, segments, transfers, counters) are bump-allocated and reset when
no collective is active in the shard; the link state (the link model's, netmodel/links.py: free
times, bandwidths, slow-link windows) and the per-sender message counters are buffers shared with
the shard's Python paths.
"""

from __future__ import annotations

import array
import threading

import numpy as np

from emulator.config.schema import ClusterConfig
from emulator.engine import kernel_cache, netkernels, netmailbox, opkernels
from emulator.engine.events import INF
from emulator.engine.netkernels import deliver_records, rehash, run_events, send_message, start_call, start_receive
from emulator.engine.netlayout import (
    ACTIVE,
    BUCKET,
    C_RUN,
    EVENTS,
    FOLD,
    GROW,
    HEAP_N,
    HIST,
    HT_FILL,
    HT_WAITER,
    MAXX,
    MSG_N,
    N_CHANS,
    N_CNT,
    N_RUNS,
    N_SEGS,
    N_ST,
    N_XFERS,
    NO_LIMIT,
    OUT_N,
    PEND_N,
    RET_PEER,
    RET_RUN,
    RET_SIG_HI,
    RET_SIG_LO,
    RET_T,
    RT_LAT,
    RT_LINKS,
    RT_NDOWN,
    RT_NUP,
    RT_TIER,
    SEND_KIND,
    SEND_ROOM,
    SEQ_COL,
    SHARD,
    SIG_BITS,
    SIG_MASK,
    TABLE,
    TABLE_2D,
    TABLE_COLS,
    TABLE_FLOAT,
    TIMELINE_MAX_SLOTS,
    TOP_KIND,
    TOP_ORIGIN,
    TOP_RANK,
    TOP_SEQ,
    TOP_T,
    TP_HDR,
    TP_NCNT,
    TP_NSEG,
    TP_NX,
)  # fmt: skip
from emulator.engine.netstats import timeline_add
from emulator.engine.opkernels import run_net
from emulator.engine.stats import ShardStats
from emulator.errors import EmulatorError
from netmodel.collectives.base import OPS
from netmodel.topology import Topology

KIND_INDEX = {name: i for i, name in enumerate(OPS)}
# the message kinds of the size histograms (ShardStats.kind_hist): the collectives', then the sends'
KINDS = (*OPS, "send")
assert KINDS.index("send") == SEND_KIND, "netkernels.SEND_KIND follows netmodel's OPS"
# NetCore.rid writes a route's row as (tier, latency, #up, #down, up links..., down links...)
assert (RT_TIER, RT_LAT, RT_NUP, RT_NDOWN, RT_LINKS) == (0, 1, 2, 3, 4), "netlayout's route columns"
# NetCore.top_key reads the top's key as one slice of st
assert (TOP_KIND, TOP_RANK, TOP_ORIGIN, TOP_SEQ) == tuple(range(TOP_T + 1, TOP_T + 5)), "netlayout's top slots"


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
        self.link_bw = topo.link_bw  # bytes per ns (the slow-link factors of the whole run included)
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
        # the link model's state (netmodel/links.py): bandwidths, the free times it shares with the
        # shard's Python paths, and the slow-link windows
        self.links = stats.links
        self.lbw, self.lfree, self.lwp, self.lwns, self.lwf = self.links.arrays()
        # bytes, busy ns, messages, max wait ns, queueing ns and queued messages (charged to the
        # link that held a message back: see netlinks._queued); flush() adds them to the links'
        self.lstat = np.zeros((6, n_links), i64)
        # live monitoring only (never read by the engine): virtual ns and calls per collective
        # kind, summed over members
        self.collective_ns: dict[str, list[int]] = {}
        self.tstat = np.zeros((tiers, 2 + HIST), i64)  # bytes, messages, size histogram
        self.khist = np.zeros((len(KINDS), HIST), i64)
        self.tl = np.zeros((tiers, size["tl"]), i64)
        self.pend = np.zeros((size["pend"], 5), i64)
        self.rank_shard = np.array(rank_shard, i64)
        self.cseqs = np.zeros(world, i64)  # per-rank step counter (part of step keys)
        # per-sender message counter (point-to-point too), shared with the shard's Python paths: seen
        # by Python as array.array, whose indexing costs a quarter of numpy's element access
        self.mseq_py = array.array("q", bytes(8 * world))
        self.mseq = np.frombuffer(self.mseq_py, dtype=i64)
        self.outb = np.zeros((size["outb"], 14), i64)
        # point-to-point messages (attach_events): the ranks' event counters (the per-op engine's
        # rank rows, opcore.OpCore.rs, column st[SEQ_COL]) and rank -> row; until then, stand-ins
        self.pseq = np.zeros((1, 1), i64)
        self.pidx = np.zeros(1, i64)
        self.px = np.zeros((1, 5), i64)  # send_message's scratch transfer row
        self.stv = memoryview(self.st)  # the top's time at a third of numpy's element access
        self.topv = self.stv[TOP_T : TOP_SEQ + 1]  # the top's key (top_key)
        self.recvs: dict[int, tuple] = {}  # a waiting receive's id -> (gpu, op)
        self.recv_ids = 0
        self._rids: dict[tuple[int, int], int] = {}
        self._templates: dict[tuple, tuple] = {}
        self.ops: dict[int, tuple] = {}  # active run -> (gpu, op)
        self.top = INF  # time of the core's next event
        self._pack()
        prepare_kernels()

    def _pack(self) -> None:
        """Write the kernels' table of the arrays (netkernels.TABLE): again whenever one is replaced."""
        # ``args`` holds every array the table points at: alive while the kernels may use them
        self.args = tuple(getattr(self, name) for name in TABLE)
        # written in place: the per-op engine holds the table's address (opcore.OpCore: its kernel sends)
        table = getattr(self, "table", None)
        if table is None:
            table = np.zeros(TABLE_COLS * len(TABLE), np.int64)
        for i, (name, a) in enumerate(zip(TABLE, self.args, strict=True)):
            # the kernels view the arrays through their data pointers with this layout (netlayout._views)
            assert a.flags.c_contiguous, f"the kernels' array {name} is C-contiguous"
            assert a.ndim == (2 if name in TABLE_2D else 1), f"the kernels' array {name} has {a.ndim} dimensions"
            assert a.dtype == (np.float64 if name in TABLE_FLOAT else np.int64), f"{name} is {a.dtype}"
            table[TABLE_COLS * i : TABLE_COLS * (i + 1)] = a.ctypes.data, a.shape[0], a.shape[1] if a.ndim == 2 else 1
        self.table = table

    # -- state read by the shard ------------------------------------------------------------
    @property
    def events(self) -> int:
        return int(self.st[EVENTS])

    def _read_top(self) -> None:
        """Refresh ``top`` (read by the shard's loop for every event: a plain attribute)."""
        t = self.stv[TOP_T]
        if t >= NO_LIMIT:
            # the kernels' int64 arithmetic (and the horizon sentinel) end here
            raise EmulatorError(f"virtual time reached {t} ns (over 2^62 ns, 146 years): beyond what the "
                                f"engine represents; check the sizes and bandwidths of this run")  # fmt: skip
        self.top = t if t >= 0 else INF

    def next_time_of(self, ranks) -> float:
        """The earliest event in the core's heap that belongs to one of ``ranks``."""
        rows = self.heap[: int(self.st[HEAP_N])]
        times = rows[np.isin(rows[:, 2], np.fromiter(ranks, np.int64, len(ranks))), 0]
        return float(times.min()) if len(times) else INF

    def top_key(self) -> tuple:
        """The key of the core's next event (the shard's loop compares it with its heaps' keys)."""
        # (Python ints: the slots' view as a list, then a tuple - a third of the time of five reads)
        return tuple(self.topv.tolist())

    # -- routes -------------------------------------------------------------------------------
    def rid(self, src: int, dst: int) -> int:
        """The row of the route from ``src`` to ``dst`` in the route table (written at its first use)."""
        key = (src, dst)
        rid = self._rids.get(key)
        if rid is None:
            # (a run meets thousands of pairs: their rows are written from the topology's links
            # without a Route object, in one write per table)
            tier, latency_ns, up, down = self.topo.route_links(src, dst)
            rid = len(self._rids)
            if rid == self.rt.shape[0]:
                self.rt = _grown(self.rt, 2 * rid)
                self.rbw = _grown(self.rbw, 2 * rid)
                self._pack()
            assert len(up) <= self.max_links and len(down) <= self.max_links, (src, dst, up, down)
            self.rt[rid, : RT_LINKS + len(up) + len(down)] = (tier, latency_ns, len(up), len(down), *up, *down)
            bw = self.link_bw
            # the slowest link of each side (Route.up_bw, Route.down_bw)
            self.rbw[rid] = (min([bw[i] for i in up]), min([bw[i] for i in down]))
            self._rids[key] = rid
        return rid

    # -- collectives --------------------------------------------------------------------------
    def _template(self, rank: int, op) -> tuple:
        """A member's call as the kernels' template (netlayout's TP_* layout: its channels, segments,
        transfers and counters in one int64 array) and its number of channels; cached per call."""
        key = (id(op.a), op.b.name)
        cached = self._templates.get(key)
        if cached is not None and cached[0] is op.a:
            return cached[1]
        chans, segs, xfs, slots, maxx, nseg, nx = [], [], [], {}, 0, 0, 0
        rid = self.rid
        for channel in op.b.segments(op.a, self.topo):
            first, rep = nseg, 0
            for sends, recvs, repeat in channel:
                if nseg == first:
                    rep = repeat  # the channel's first segment's repeats
                s_lo = nx
                for peer, size, chan in sends:
                    xfs += (peer, size, chan, rid(rank, peer), slots.setdefault((0, peer, chan), len(slots)))
                nx += len(sends)
                r_lo = nx
                for peer, size, chan in recvs:
                    xfs += (peer, size, chan, -1, slots.setdefault((1, peer, chan), len(slots)))
                nx += len(recvs)
                segs += (s_lo, len(sends), r_lo, len(recvs), repeat)
                nseg += 1
                maxx = max(maxx, len(sends), len(recvs))
            chans += (first, nseg, rep)
        nch = len(chans) // 3
        head = (nch, nseg, nx, len(slots), maxx, KIND_INDEX[op.a.op])
        template = (np.array((*head, *chans, *segs, *xfs), np.int64), nch)
        self._templates[key] = (op.a, template)
        return template

    def start(self, gpu, op, t: int) -> int:
        """Start ``op`` (a collective) for ``gpu`` at ``t``; returns the kernel status, or -1 when
        the call has no channels (the shard completes it at once)."""
        tp, nch = self._template(gpu.rank, op)
        if not nch:
            return -1
        st = self.stv
        run = st[N_RUNS]
        self.ops[run] = (gpu, op)
        sig, (gid, cseq) = op.d, op.c
        status = start_call(self.table, tp, gid, cseq, sig & SIG_MASK, sig >> SIG_BITS, gpu.rank, t)
        if status == GROW:  # nothing done but the widest step noted: grow the tables, then start
            self._ensure(run + 1, st[N_CHANS] + nch, st[N_SEGS] + tp[TP_NSEG], st[N_XFERS] + tp[TP_NX],
                         st[N_CNT] + tp[TP_NCNT], nch * (st[MAXX] + 2) + SEND_ROOM)  # fmt: skip
            status = start_call(self.table, tp, gid, cseq, sig & SIG_MASK, sig >> SIG_BITS, gpu.rank, t)
            assert status != GROW, "NetCore._ensure grows what netkernels.start_call tests"
        self._read_top()
        return status

    def run(self, limit: tuple | None, horizon: int, receives: tuple | None = None) -> int:
        """Process events before ``limit`` (a Python heap key: its first five fields) and ``horizon``;
        returns the status. ``receives``: the per-op engine's kernel arguments (OpCore.args) where
        the tapes' receives that hand-overs complete complete in the same call, the run going on
        past them (opkernels.run_net: the limit then counts that engine's heap too; its status
        NET_KRECV where Python goes on after one)."""
        # (called for nearly every message event: the status is the kernel's return value, and
        # _read_top's checks run only when the core's heap is empty or its top out of range)
        if receives is not None:
            if limit is None:
                status = run_net(*receives, NO_LIMIT, 0, 0, 0, 0, horizon)
            else:
                status = run_net(*receives, limit[0], limit[1], limit[2], limit[3], limit[4], horizon)
        elif limit is None:
            status = run_events(self.table, NO_LIMIT, 0, 0, 0, 0, horizon)
        else:
            status = run_events(self.table, limit[0], limit[1], limit[2], limit[3], limit[4], horizon)
        t = self.stv[TOP_T]
        if 0 <= t < NO_LIMIT:
            self.top = t
        else:
            self._read_top()
        if status == GROW:
            self._ensure(0, 0, 0, 0, 0, int(self.st[MAXX]) + 2 + SEND_ROOM)
        return status

    def finished(self) -> tuple:
        """The run that the last call completed: ``(gpu, op, t)``."""
        st = self.stv  # (Python ints: a third of numpy's element access)
        gpu, op = self.ops.pop(st[RET_RUN])
        t = st[RET_T]
        self.note_collective(op, t)
        return gpu, op, t

    def note_collective(self, op, t_end: int) -> None:
        """Live figures: ``op`` (a collective started at ``op.t_start``) of one member ends at ``t_end``."""
        acc = self.collective_ns.get(op.a.op)
        if acc is None:
            acc = self.collective_ns[op.a.op] = [0, 0]
        acc[0] += t_end - op.t_start
        acc[1] += 1

    def reset_if_idle(self) -> None:
        """No collective in progress: reuse the tables from the start (they only grow otherwise)."""
        st = self.stv
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

    # -- point-to-point messages (p2p.PointToPoint, where the core takes them) --------------------
    def attach_events(self, rs: np.ndarray, rank_index: np.ndarray, seq_col: int) -> None:
        """Take point-to-point messages: a receive's completion takes its rank's event counter,
        column ``seq_col`` of row ``rank_index[rank]`` of ``rs`` (the per-op engine's, shared with
        the Python rules: CompiledGPU.seq)."""
        self.pseq, self.pidx = rs, rank_index
        self.st[SEQ_COL] = seq_col
        self._pack()

    def send(self, src: int, dst: int, size: int, tag: int, k: int, t: int) -> int:
        """A pipeline send's message (group id 0): when its tail leaves the up-links."""
        rid = self._rids.get((src, dst))
        if rid is None:
            rid = self.rid(src, dst)
        end_up = send_message(self.table, src, dst, rid, size, tag, k, t)
        if end_up < 0:  # an array is full (netkernels._room): nothing was done
            self._ensure(0, 0, 0, 0, 0, int(self.st[MAXX]) + 2 + SEND_ROOM)
            end_up = send_message(self.table, src, dst, rid, size, tag, k, t)
        t_top = self.stv[TOP_T]
        if 0 <= t_top < NO_LIMIT:
            self.top = t_top
        else:
            self._read_top()
        return end_up

    def receive(self, gpu, op, src: int, tag: int, k: int, t: int) -> int:
        """A pipeline receive starts: its message's delivery time (taken from the mailbox), or -1
        when it waits (its completion comes as RECV_DONE), or -3 for a message of another size
        (``st[RET_SIG_LO]``)."""
        recv = self.recv_ids
        got = start_receive(self.table, gpu.rank, src, tag, k, recv, op.b, t)
        if got == -2:  # the hash table is full
            self._ensure(0, 0, 0, 0, 0, 2)
            got = start_receive(self.table, gpu.rank, src, tag, k, recv, op.b, t)
        if got == -1:
            self.recvs[recv] = (gpu, op)
            self.recv_ids = recv + 1
        return got

    # -- cross-shard messages -----------------------------------------------------------------
    def deliver(self, records: list) -> None:
        """Collective messages from other shards (outbox tuples)."""
        recs = np.array([(*r[:10], r[10] & SIG_MASK, r[10] >> SIG_BITS) for r in records], np.int64)
        rids = np.array([self.rid(r[2], r[1]) for r in records], np.int64)
        self._ensure(0, 0, 0, 0, 0, len(records) + 2 + SEND_ROOM)
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
        queued_ns, queued = self.links.queued_ns, self.links.queued_messages
        for link in np.nonzero(lstat[2])[0].tolist():
            nbytes, busy, messages, wait, waited_ns, waited = (int(v) for v in lstat[:, link])
            queued_ns[link] += waited_ns
            queued[link] += waited
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
            hist = stats.kind_hist.setdefault(KINDS[kind], {})
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


_warming: threading.Thread | None = None
_prepared = False  # prepare_kernels ran in this process


def prepare_kernels() -> None:
    """Compile the kernels in a background thread, once per process, while the run starts in Python,
    where numba's cache lacks one: the first run after an edit of a file in kernel_cache.SOURCES compiles
    them (tens of seconds), which would otherwise stall the run - and its live figures - at its first
    message-level collective. With all of them cached, nothing is started: each kernel loads at its
    first call (~10 ms), and only those the run calls (the straggler run of the 3072-GPU scenario calls
    11 of the 16; loading all of them beside the run cost ~0.1 s more CPU).

    Not a daemon thread: the interpreter waits for it at exit rather than killing numba mid-compile.
    A kernel called while the thread compiles it waits on numba's compiler lock (no other effect)."""
    global _warming, _prepared
    if not _prepared:
        _prepared = True
        if not kernel_cache.cached((netkernels, netmailbox, opkernels)):
            _warming = threading.Thread(target=warm_up, name="netkernels-warm-up")
            _warming.start()


def kernels_compiling() -> bool:
    """Whether the kernels are still being loaded or compiled (see :func:`prepare_kernels`)."""
    return _warming is not None and _warming.is_alive()


def warm_up() -> None:
    """Load every kernel (compiled on first use, then from numba's cache in ``__pycache__``): the
    first call of each costs ~0.3 s; benchmarks call this before starting their clocks."""
    topo = Topology(ClusterConfig())
    core = NetCore(topo, 0, [0] * topo.world_size, 1, ShardStats(topo))
    run_events(core.table, 0, 0, 0, 0, 0, 0)
    core.attach_events(np.zeros((1, 1), np.int64), np.zeros(topo.world_size, np.int64), 0)
    core.send(0, 1, 1, 0, 0, 0)
    core.receive(_Recv0(), _Recv0(), 1, 0, 0, 0)
    start_call(core.table, np.zeros(TP_HDR, np.int64), 0, 0, 0, 0, 0, 0)  # a call without channels
    core.st[ACTIVE] = core.st[N_RUNS] = 0
    deliver_records(core.st, core.heap, core.msg, core.mfree, np.zeros((0, 12), np.int64), np.zeros(0, np.int64))
    rehash(core.htk, core.htv, core.hts, core.htk.copy(), core.htv.copy(), core.hts.copy(), core.st)
    timeline_add(core.tl, core.pend, core.st, 0, 1, 1, 0, 1, 1000)
    from emulator.engine.opcore import warm_up as warm_up_ops  # the per-op engine's kernels too

    warm_up_ops(core)



class _Recv0:
    """warm_up's stand-in of a receive (as ``gpu`` and ``op``: rank 0, size 1)."""

    rank = 0
    b = 1

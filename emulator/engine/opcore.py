"""The compiled per-op engine (``engine.op_engine: compiled``): the built-in workload's op blocks run
in numba (emulator/engine/opkernels.py), many events per call.

A block is what tensor_parallel.launch_prepared launches for a layer, or for a chunk's layers back
to back (training.run_layers / join_layers, tensor_parallel.repeat_prepared): fused compute
segments on the ``compute`` stream and the tensor group's collectives between them on ``tp``, and
the allocs and frees the program launches between them on ``compute`` (a microbatch's
activations before its forward layers; each rebuilt layer's around its backward, the activations'
free after them). When the tensor group is folded into one virtual GPU (emulator/engine/folding.py)
those collectives are closed-form calls of one arrival (collective_run.py), so a block's events -
compute completions and closed-form completions, 82% of the reference run's - touch only the
rank's two streams, its node's ports and the statistics. The shard keeps one Python op per block
on its ``compute`` stream, the block's *proxy*: the block's first op waits for what the proxy
waits for, and the proxy completes with the block's last op (every tensor collective of an
eligible block is waited for before it), so the other streams, the program and the Python rules
see the block as they see its ops.

Allocs and frees are instant ops (Shard._instant): the kernels run them where the compute stream's
loop (Shard._try_start) reaches them - memory in use and its peak (shared counters,
CompiledGPU.mem_used / mem_peak), the capacity check, the counters - and the loop goes on with the
next op at the same time. Where the Python rules would act half way through that loop the kernels
stop and OpCore.instant_stop goes on: a suspended program that an instant op's completion lets run
again (Shard._complete's check after it: ST_IRESUME, then ``cont`` goes on with the loop), a block
whose last op is a free (ST_IBLOCK: the proxy completes as that free would, as a BLOCK, and the
shard's compute stream goes on), an alloc past the capacity (ST_OOM: the same OutOfMemoryError,
vgpu.oom_message). The rank's set of live allocations, which only that message reads, takes a
block's allocs and frees when it ends (or up to the failing alloc); nothing of the rank's can
allocate in between (the proxy holds the compute stream). An alloc or free is taken only where it
owes no wait (a collective waited for, a ``"w"``, since the last compute op): the Python rules
would give it that dependency.

The kernels apply Shard.launch / _try_start / _complete to the block's ops with the same event keys
``(t, EV_OP_DONE, rank, rank, seq)`` from the rank's one ``seq`` counter; the shard merges their heap
with its own and the message-level core's by key, so the order, hence every result, is the one of
the Python path (``engine.op_engine: python``, the specification). Python runs only where a block
ends (its proxy completes: dependents on other streams, the next op), where a program must resume,
and for every other op kind. tests/emulator/engine/test_opcore.py compares both paths bit for bit on
fuzzed configs.

Where it applies (else the Python path runs, with the same results): the built-in workload without
faults, context parallelism or experts, with folded tensor groups (folding.py: tensor = GPUs per
node; unfolded or with tensor 1 the kernels would save nothing, Shard.__init__), whose node groups
run the tensor collectives with analytic algorithms (Shard._closed_tensor_ops); an untraced rank;
blocks that start and end with compute, an alloc or a free and run some compute, whose collectives
are the tensor group's in closed form with one arrival, each waited for inside the block. Any
number of shards, in-process or on Ray: a proxy carries its block's least duration along its two
streams (lookahead.block_bound, once per template; allocs and frees take no time), so the
lookahead's bounds (lookahead.py) stay lower bounds, as tight as the block's ops would give.

Calls are cheap where they can be: the kernels take five packed buffers (opkernels.H_*) rather than
fifteen arrays, a block begins in its rank's next kernel call (``R_BEGIN``), and the Python rules
touch plain fields for the order-free totals (CompiledGPU).
"""

from __future__ import annotations

import mmap

import numpy as np

from emulator.engine import opkernels as k
from emulator.engine.events import EV_OP_DONE, INF, at_event
from emulator.engine.netkernels import MAXX, SEND_ROOM
from emulator.engine.opmessages import KernelMessages, _grown
from emulator.engine.ops import BLOCK, COMPUTE, Allocation, BlockProxy, Op
from emulator.engine.optemplates import BlockTemplates, _memory_plan
from emulator.engine.vgpu import VirtualGPU, oom_message
from emulator.errors import EmulatorError, OutOfMemoryError

# the hot reads of the kernels' globals (a module attribute lookup less each)
_G_ERR, _G_NOVF, _G_HEAPN, _G_STATUS = k.G_ERR, k.G_NOVF, k.G_HEAPN, k.G_STATUS
_G_SENT, _G_LOW, _G_RDRAIN, _ST_RMISMATCH = k.G_SENT, k.G_LOW, k.G_RDRAIN, k.ST_RMISMATCH
_G_RET_RI, _G_RET_T, _G_RET_TSTART, _ST_LIMIT, _NO_LIMIT = k.G_RET_RI, k.G_RET_T, k.G_RET_TSTART, k.ST_LIMIT, k.NO_LIMIT
_R_BEGIN, _ST_SUSPEND, _R_ADONE = k.R_BEGIN, k.ST_SUSPEND, k.R_ADONE

# the block streams' waits: (hit flag, ns, stream, the stream it waited for) (Shard._try_start)
_WAITS = ((k.R_WCT_HIT, k.R_WCT, "compute", "tp"), (k.R_WTC_HIT, k.R_WTC, "tp", "compute"))


class CompiledGPU(VirtualGPU):
    """A virtual GPU whose shared counters live in the compiled engine's arrays (read and written by
    both the Python rules and the kernels): ``seq`` (one event-key counter), ``outstanding``,
    ``mem_used`` and ``mem_peak``,
    ``flops_done`` (a float sum: one accumulator keeps the order of its additions); ``suspended``
    and ``sync_op`` are mirrored there for the kernels to read. The order-free totals ``ops_done``,
    ``compute_ns``, ``comm_ns`` (sums) and ``last_time`` (a maximum) are VirtualGPU's plain fields
    for the Python rules, the kernels keep their own share, and OpCore.flush adds it (ShardStats.flush,
    before anything reads them): a plain field costs a fifth of an array-backed property on the
    Python path's every op. The arrays are read through memoryviews (Python ints and floats, as
    ``ndarray.item`` gives, at half its cost)."""

    __slots__ = ("_mv", "_fmv", "_ri", "_sync", "_susp")

    def __init__(self, rank: int, node: int, spec, capacity_bytes: int, core: OpCore):
        self._ri = int(core.rank_index[rank])
        self._mv = memoryview(core.rs[self._ri])
        self._fmv = memoryview(core.rf)
        self._sync = None
        self._susp = False
        super().__init__(rank, node, spec, capacity_bytes)
        self._mv[k.R_CAP] = capacity_bytes

    def _shared(field):  # noqa: N805 - builds the properties below
        def get(self):
            return self._mv[field]

        def put(self, value):
            self._mv[field] = value

        return property(get, put)

    seq = _shared(k.R_SEQ)
    outstanding = _shared(k.R_OUT)
    # memory: blocks allocate and free in the kernels (their I_A / I_F rows), other ops in Python
    mem_used = _shared(k.R_MEM)
    mem_peak = _shared(k.R_PEAK)
    del _shared

    @property
    def suspended(self) -> bool:
        return self._susp

    @suspended.setter
    def suspended(self, value: bool) -> None:
        self._susp = value
        self._mv[k.R_SUSP] = 1 if value else 0

    @property
    def sync_op(self):
        return self._sync

    @sync_op.setter
    def sync_op(self, op) -> None:
        self._sync = op
        self._mv[k.R_SYNC] = 0 if op is None else 1

    @property
    def flops_done(self) -> float:
        return self._fmv[self._ri]

    @flops_done.setter
    def flops_done(self, value: float) -> None:
        self._fmv[self._ri] = value


class OpCore(KernelMessages, BlockTemplates):
    """The shard's compiled block engine: per-rank streams of block ops, their heap, plans."""

    def __init__(self, shard):
        self.shard = shard
        ranks = sorted(shard.gpus)
        # the heap's packed keys hold a rank in RANK_BITS bits (opkernels._push)
        assert shard.topo.world_size <= 1 << k.RANK_BITS, "compiled op engine: more GPUs than its keys hold"
        self.rank_index = np.full(shard.topo.world_size, -1, np.int64)
        for i, r in enumerate(ranks):
            self.rank_index[r] = i
        n = len(ranks)
        # a rank's block ops in flight: at most max_ahead launched and not done (the rank's
        # outstanding ops; a block's first op is counted as its proxy), with a margin; a slot is
        # reused a ring later (opkernels._new_op checks that its op is done) and the kernels keep no
        # reference to a done op (opheap._forget). A ring no longer than that keeps the slots
        # reused soon after they were freed, in the cache (the reference run: 384 ranks, 24 MiB)
        ring = 64
        while ring < shard.max_ahead + 128:
            ring *= 2
        # the heap holds at most one event per stream head the kernels start: a rank's compute
        # stream, its tensor stream and each of its NSS kernel message slots (a tape's send leaving,
        # a receive's delivery: opsends._try_s, _try_r), and 16 rows to spare. opheap._push checks
        # no room (numba checks no bounds) and the rows past the end are ``g``'s: sized for the two
        # streams alone (2 * n + 16), the kernels' messages in flight overwrote G_HEAPN with a time
        # (a segfault: 96 ranks, 48 of them sending, in validate's Megatron 70B H100 row)
        heap_rows = (2 + k.NSS) * n + 16
        # the fixed-size arrays live in two buffers (opkernels.H_*: one argument each per kernel call)
        n_links = len(shard.links.free)
        fixed = ((k.H_RS, (n, k.R_FIELDS)), (k.H_OPS, (n * ring, k.O_FIELDS)), (k.H_HEAP, (heap_rows, 3)),
                 (k.H_G, (k.G_FIELDS,)), (k.H_QN, (n_links,)), (k.H_QM, (n_links,)), (k.H_OVF, (1 << 14, 4)),
                 (k.H_GR, (n, k.GR_FIELDS)))  # fmt: skip
        # each array starts on a 64-byte line (an op's row is two lines: opkernels.O_FIELDS)
        self.ib = _zeros(k.IB_HEADER + sum(int(np.prod(shape)) + 8 for _, shape in fixed), np.int64)
        at = k.IB_HEADER
        views = []
        for h, shape in fixed:
            at += (-(self.ib.ctypes.data + 8 * at) % 64) // 8
            size = int(np.prod(shape))
            self.ib[h], self.ib[h + 1] = at, shape[0]
            views.append(self.ib[at : at + size].reshape(shape))
            at += size
        self.rs, self.ops, self.heap, self.g, self.qn, self.qm, self.ovf, self.gr = views
        self.fb = _zeros(n * ring + n, np.float64)
        self.ib[k.H_OF], self.ib[k.H_OF + 1] = 0, n * ring
        self.ib[k.H_RF], self.ib[k.H_RF + 1] = n * ring, n
        self.of, self.rf = self.fb[: n * ring], self.fb[n * ring :]
        for col in (k.R_CHEAD, k.R_CTAIL, k.R_CBLK, k.R_LASTC, k.R_THEAD, k.R_TTAIL, k.R_TBLK, k.R_PEND, k.R_BEGIN,
                    k.R_RPEND):
            self.rs[:, col] = -1
        self.rs[:, k.R_RANK] = ranks
        self.ranks = ranks  # rank index -> rank
        self.gm = memoryview(self.g)  # Python ints at a third of a numpy scalar's cost (the hot reads)
        self.top_row = memoryview(self.heap[0])
        self.g[k.G_RING] = ring
        self.g[k.G_MAXAHEAD] = shard.max_ahead
        self.g[k.G_BUCKET] = shard.stats.bucket_ns
        # the arrays that grow (templates, plans, the tier-0 timeline): packed again when one does
        self.ti = np.zeros((256, 3), np.int64)
        self.tf = np.zeros(256, np.float64)
        self.tp = np.zeros((16, 2), np.int64)
        self.n_ti = self.n_tp = 0
        self.template_of: dict[tuple, int] = {}  # a template's rows -> its index
        self.bounds: list[tuple] = []  # template -> its proxy's (least_ns, reset_ns) (lookahead.block_bound)
        self.bound_of: dict[tuple, tuple] = {}  # block_bound's steps -> its figures
        self.pl = np.zeros((16, k.P_FIELDS), np.int64)
        self.plk = np.zeros(256, np.int64)
        self.n_pl = self.n_plk = 0
        self.plan_of: dict[int, tuple] = {}  # id(closed plan) -> (plan, index)
        self.plan_alike: dict[tuple, int] = {}  # a plan's figures -> its index (_plan: a group's members share it)
        self.plan_info: list[tuple] = []  # index -> (accumulator, collective op name)
        self.group_index: dict[tuple, int] = {}  # a tensor group's ranks -> its row of ``gr``
        self.sig_index: dict[int, int] = {}  # a call's signature -> a small int (the kernels compare them)
        self.python_groups: dict[tuple, bool] = {}  # a tensor group's ranks -> whether Python runs it
        # a slow GPU's kernels: their durations as launched (faults.py), taken by the templates;
        # Shard.__init__ runs the kernels only where no fault depends on the time or the kernel's index
        self.faults = shard.compute_faults
        self.free = shard.links.free
        self.tl = np.zeros(1 << 16, np.int64)
        # id(block) -> (block, template or -1, (gid, collectives), the proxy's (a, b))
        self.blocks: dict[int, tuple] = {}
        self.core_ranks: set[int] = set()  # ranks whose tensor stream the kernels hold
        self.python_ranks: set[int] = set()  # ranks that launched tensor collectives in Python
        self.proxies: dict[int, Op] = {}  # rank index -> the proxy of its running block
        self.suffix = ""  # the next block's compute ops' names' (launch_prepared's; api.GPU.launch_block, tape.py)
        self.top = INF
        # kernel sends (launch_send): their descriptors (opkernels.SD_*) and counters, the
        # descriptor of (rank, stream, destination, tag) and of a message, each rank's stream slots by name, and the
        # stand-ins of the streams whose sends the kernels hold, by (rank, stream)
        self.sd = np.zeros((16, k.SD_FIELDS), np.int64)
        self.kc = np.zeros(16, np.int64)
        self.n_sd = 0
        self.desc_of: dict[tuple, int] = {}
        self.send_desc: dict[int, tuple] = {}  # id(a prepared message) -> (it, its descriptor, its GPU)
        # the steps one launch_steps call hands the kernels (opkernels.launch_steps' ``st``), at most
        # this many (the program is suspended after a few blocks' ops: max_ops_ahead)
        self.step_rows = np.zeros((16, 5), np.int64)
        self.step_view = memoryview(self.step_rows.reshape(-1))
        # template b -> the outstanding ops a step of its block adds (launch_steps: Tape.run's proxy, the
        # block's rows after the first but its waits, the send and the next step's receive)
        self.step_out: dict[int, int] = {}
        self.slot_names: dict[int, list] = {}  # rank index -> stream names by slot
        self.slot_descs: dict[tuple, list] = {}  # (rank, stream) -> its descriptors
        self.stand_ins: dict[tuple, Op] = {}
        core = getattr(shard, "core", None)
        self.net = core.table if core is not None else np.zeros(3 * len(k._NET_TABLE), np.int64)
        self._pack()

    def enable_sends(self) -> None:
        """Pipeline sends from tapes run in the kernels from now on (Shard.__init__: tape.py's kernel mode)."""
        self.g[k.G_NET] = 1

    def _pack_if_grown(self) -> None:
        """:meth:`_pack` when one of the growing arrays was grown (is no longer a view of the buffer)."""
        gb = self.gb  # (called after every new template, plan and message descriptor: no generator)
        if (self.ti.base is not gb or self.tp.base is not gb or self.pl.base is not gb or self.plk.base is not gb
                or self.tl.base is not gb or self.sd.base is not gb or self.kc.base is not gb
                or self.tf is not self.buffers[3]):  # fmt: skip
            self._pack()

    def _pack(self) -> None:
        """Copy the growing arrays into one buffer (opkernels.H_TI ...) and view them there again."""
        parts = ((k.H_TI, self.ti), (k.H_TP, self.tp), (k.H_PL, self.pl), (k.H_PLK, self.plk), (k.H_TL, self.tl),
                 (k.H_SD, self.sd), (k.H_KC, self.kc))  # fmt: skip
        gb = np.zeros(k.GB_HEADER + sum(a.size for _, a in parts), np.int64)
        at = k.GB_HEADER
        views = []
        for h, a in parts:
            gb[h], gb[h + 1] = at, a.shape[0]
            view = gb[at : at + a.size].reshape(a.shape)
            view[...] = a
            views.append(view)
            at += a.size
        self.ti, self.tp, self.pl, self.plk, self.tl, self.sd, self.kc = views
        self.gb = gb
        # the kernels' one array argument, by its address (opkernels' entry points: oplayout.C_*); the
        # buffers it names are held here, alive as long as the table names them
        self.buffers = (self.ib, gb, self.fb, self.tf, self.free, self.net)
        self.call = np.array([a.ctypes.data for a in self.buffers], np.int64)
        self.args = (self.call.ctypes.data,)

    @property
    def events(self) -> int:
        return self.gm[k.G_EVENTS]

    def _after(self) -> int:
        """After a kernel call: its errors, its timeline overflow, the heap's top; its status."""
        g = self.gm
        if g[_G_ERR] or g[_G_NOVF]:
            self._overflowed()
        if g[_G_SENT] or g[_G_LOW] or g[_G_RDRAIN]:
            self._net_after()
        self.top = self.top_row[0] if g[_G_HEAPN] else INF
        status = g[_G_STATUS]
        if status == _ST_RMISMATCH:
            self._mismatch()
        return status

    def _net_after(self) -> None:
        """After a call that sent: the message core's next event, and room for the next call's sends."""
        g = self.gm
        core = self.shard.core
        if g[_G_LOW]:
            g[_G_LOW] = 0
            core._ensure(0, 0, 0, 0, 0, int(core.st[MAXX]) + 2 + SEND_ROOM)
        g[_G_SENT] = 0
        core._read_top()
        if g[_G_RDRAIN]:
            # a sealed receive stream's last kernel receive completed at once inside the call (its
            # dependents were gated): Python's ops behind it go on now, as right after it
            slot, ri = g[_G_RDRAIN] - 1, g[k.G_RDRAIN_RI]
            g[_G_RDRAIN] = 0
            self.drained(self.shard.gpus[self.ranks[ri]], slot, g[k.G_RDRAIN_T], False)

    def _overflowed(self) -> None:
        g = self.gm
        if g[k.G_ERR]:
            raise AssertionError(
                {1: "compiled op engine: a ring, dependency table or the timeline's overflow rows overflowed",
                 2: "compiled op engine: a tensor group's members' calls differ",
                 3: "compiled op engine: a rank's event counter passed its packed key's bound",
                 4: "compiled op engine: a send's block is not the compute stream's last",
                 5: "compiled op engine: a receive completed at once released more than a gated op"}[g[k.G_ERR]]
            )  # fmt: skip
        if g[k.G_NOVF]:
            add = self.shard.stats.timeline_add
            bucket = int(g[k.G_BUCKET])
            last = 0
            for size, count, t, t_end in self.ovf[: g[k.G_NOVF]].tolist():
                add(0, size, count, t, t_end)
                last = max(last, max(t, t_end - 1) // bucket)
            g[k.G_NOVF] = 0
            if last >= len(self.tl) and last < 1 << 24:  # later transfers of this run: in the array
                self.tl = _grown(self.tl, 2 * last)
                self._pack()

    def top_key(self) -> tuple:
        h = self.top_row
        key = h[1]  # rank << SEQ_BITS | seq (opkernels._push)
        rank = key >> k.SEQ_BITS
        return h[0], 2, rank, rank, key & k.SEQ_MASK

    def next_time_of(self, ranks) -> float:
        rows = self.heap[: int(self.g[k.G_HEAPN])]
        times = rows[np.isin(rows[:, 1] >> k.SEQ_BITS, np.fromiter(ranks, np.int64, len(ranks))), 0]
        return float(times.min()) if len(times) else INF

    # -- launching (from the program) ---------------------------------------------------------
    def launch(self, gpu: VirtualGPU, block: list, memory: list | None = None) -> bool:
        """Launch a prepared block (tensor_parallel.prepare_segments) as launch_prepared would;
        False when it is not eligible (the caller launches it op by op). ``memory``: its alloc and
        free rows' allocations by slot, as tensor_parallel.launch_prepared takes them."""
        known = self.known(gpu, block)
        if not self.claim(gpu, known):
            return False
        self.begin(gpu, known, memory)
        shard = self.shard
        while self.launch_rest(gpu) == k.ST_SUSPEND:
            shard._suspend(gpu)
        return True

    def known(self, gpu: VirtualGPU, block: list) -> tuple:
        """The block's entry for ``gpu``: (block, template or -1, (gid, collectives), the proxy's
        figures, its memory rows), made once per block (and slow rank)."""
        rank = gpu.rank
        faults = self.faults
        # a slow GPU's blocks have their own templates (their durations as launched)
        key = id(block) if faults is None or rank not in faults.ranks else (id(block), rank)
        known = self.blocks.get(key)
        if known is None or known[0] is not block:
            b, extra = self._template(block, rank)
            # the proxy's ``a``, ``b``, ``c`` and ``d``: the block's least duration (its ops'
            # durations as launched along its streams, lookahead.block_bound: the lookahead's stream
            # sums), the FLOPs of its last compute op, whose figures it takes when it completes, that
            # op's nominal duration on a slow GPU (Shard._complete: the time the fault cost; the
            # kernels count the block's other ops, R_LOST), and the least time from an arrival to
            # its end through a collective of several arrivals (Shard.launch: its ``dl``); a block
            # that ends with an alloc or free: its proxy stays a BLOCK (Shard._complete), the
            # kernels count every compute op
            figures = mem_rows = None
            if b >= 0:
                last = self.tp.item(b, 0) + self.tp.item(b, 1) - 1
                least, reset = self.bounds[b]
                if self.ti.item(last, 0) != k.I_C:
                    figures = (least, None, None, reset)
                else:
                    nominal = None
                    if faults is not None and rank in faults.ranks:
                        nominal = self.ti.item(last, 1) - self.ti.item(last, 2)
                    figures = (least, self.tf.item(last), nominal, reset)
                # (row, slot, alloc or free, bytes, name) of its memory rows
                mem_rows = tuple((pos, row[1], row[0] == "a", row[2], row[3]) for pos, row in enumerate(block)
                                 if row[0] == "a" or row[0] == "f") or None  # fmt: skip
            known = self.blocks[key] = (block, b, extra, figures, mem_rows, _memory_plan(mem_rows))
        return known

    def eligible(self, gpu: VirtualGPU, known: tuple) -> bool:
        """Whether :meth:`claim` would take the block (the tape asks before it plans the block)."""
        return known[1] >= 0 and not (known[2] and gpu.rank in self.python_ranks)

    def claim(self, gpu: VirtualGPU, known: tuple) -> bool:
        """Whether the kernels run the block of entry ``known`` (:meth:`known`); when they do, its
        tensor calls are counted as launched (the group's call numbers)."""
        rank = gpu.rank
        b, extra = known[1], known[2]
        # a rank's tensor stream is the kernels' or Python's, never both: a block with tensor
        # collectives goes where the rank's first such block went (the shard's gate, opcore's
        # module docstring, makes them all eligible or none)
        if b < 0:
            if extra:
                assert rank not in self.core_ranks, f"rank {rank}: a tensor stream both compiled and in Python"
                self.python_ranks.add(rank)
            return False
        if extra and rank in self.python_ranks:
            return False
        if extra:
            if rank not in self.core_ranks:  # its tensor stream where Python makes it, for reports (diagnose.py)
                gpu.stream("compute"), gpu.stream("tp")
            self.core_ranks.add(rank)
            gid, calls = extra
            gpu.coll_seq[gid] = gpu.coll_seq.get(gid, 0) + calls
        return True

    def begin(self, gpu: VirtualGPU, known: tuple, memory: list | None) -> None:
        """The block's proxy launched on the shard's compute stream (its stream position and
        dependencies; Shard.launch may suspend the program after it); :meth:`launch_rest` goes on."""
        # the block's first op: its stream position and dependencies on the shard's compute stream
        gpu._mv[_R_BEGIN] = known[1]  # begun by the rank's next kernel call (opstreams._begin_pending)
        self.shard.launch(gpu, self._proxy(known, memory), "compute")

    def begin_step(self, gpu: VirtualGPU, known: tuple, memory: list, after: Op | None) -> None:
        """:meth:`begin` for a tape's step (tape.py), the step's receive ``after`` (None: done, or
        none) waited for first (Op.wait): Shard.launch_block, that launch's rules for a proxy."""
        gpu._mv[_R_BEGIN] = known[1]
        self.shard.launch_block(gpu, self._proxy(known, memory), after)

    def _proxy(self, known: tuple, memory: list | None) -> Op:
        """A block's proxy and its memory rows' Allocations (:meth:`begin`; the caller begins its
        block: R_BEGIN, or the kernels' launch_steps)."""
        _, _, _, figures, mem_rows, plan = known
        # the proxy, which takes the block's last compute op's figures when it completes (block_done)
        # (with its entry and its ops' names' suffix, for a deadlock report: diagnose.py)
        proxy = BlockProxy(figures, known, self.suffix)
        if mem_rows is not None:
            # the Allocations as GPU.alloc / GPU.free make them at launch (each slot's last one); the
            # rank's set of live ones takes what the block leaves of them when it ends
            # (_apply_memory: nothing reads it before; _memory_plan)
            given = memory[:]
            finals, kept, freed = plan
            for slot, name, size in finals:
                memory[slot] = Allocation(given[slot] if name is None else name, size)
            # (tuples built a slot at a time: a block keeps or frees a slot or two, most none or one,
            # where a comprehension's frame or a map's bound method cost more than the slot)
            net = ()
            for slot in kept:
                net += (memory[slot],)
            dropped = ()
            for slot in freed:
                obj = given[slot]
                assert not obj.freed, obj  # (GPU.free's check; the built-in workload frees once)
                obj.freed = True
                dropped += (obj,)
            proxy.mem = (net, dropped, mem_rows, given)
        return proxy

    def launch_rest(self, gpu: VirtualGPU) -> int:
        """The rest of a block's launch (after :meth:`begin`) in the kernels: ST_SUSPEND when the
        program must suspend first (call again once it resumed), else ST_LAUNCHED (the program may
        have been suspended after the block's last row, an alloc or free that ran at once)."""
        shard = self.shard
        k.launch_rest(*self.args, gpu._ri, shard.now)
        g = self.gm  # (_after, inline)
        if g[_G_ERR] or g[_G_NOVF]:
            self._overflowed()
        self.top = self.top_row[0] if g[_G_HEAPN] else INF
        status = g[_G_STATUS]
        if status == _ST_SUSPEND:
            return status
        if status != k.ST_LAUNCHED:
            # its last row, an alloc or free, ran at once (the program runs: no ST_IRESUME)
            self.instant_stop(gpu, status, shard.now)
            if gpu.outstanding >= shard.max_ahead and not gpu.suspended:
                shard._suspend(gpu)  # Shard.launch's check after that row
        return k.ST_LAUNCHED

    # -- events ---------------------------------------------------------------------------------
    def start_block(self, gpu: VirtualGPU, proxy: Op, t: int) -> None:
        ri = gpu._ri
        self.proxies[ri] = proxy
        k.start_block(*self.args, ri, t)
        g = self.gm  # (_after, inline)
        if g[_G_ERR] or g[_G_NOVF]:
            self._overflowed()
        self.top = self.top_row[0] if g[_G_HEAPN] else INF
        status = g[_G_STATUS]
        if status != _ST_LIMIT:
            self.instant_stop(gpu, status, t)

    def instant_stop(self, gpu: VirtualGPU, status: int, t: int) -> None:
        """Go on where an alloc or free stopped the kernels in the compute stream's loop
        (Shard._try_start's, at ``t``) until that loop ends: the program resumes
        (Shard._complete's check after the instant op) and the loop goes on (ST_IRESUME); the
        block's last op was that alloc or free (ST_IBLOCK): its proxy completes as the op would
        (start_next=False) and the shard's compute stream goes on; or the alloc ran out of memory."""
        shard = self.shard
        if gpu._mv[_R_ADONE]:
            self.settle(gpu)
        while status == k.ST_IRESUME:
            shard._maybe_resume(gpu)
            k.cont(*self.args, gpu._ri, t)
            status = self._after()
        if status == k.ST_IBLOCK:
            proxy = self.proxies[gpu._ri]
            self._apply_memory(gpu, proxy)
            # a kernel receive it released that completed at once lets the next block's proxy start
            # where the Python rules would: among the block's dependents, before the program's check
            released = self.gm[k.G_PREL]
            if released:
                self.gm[k.G_PREL] = 0
            shard._complete(gpu, proxy, t, start_next=released != 0)
            if proxy.stream.ops:
                shard._try_start(gpu, proxy.stream)
        elif status == k.ST_OOM:
            self._out_of_memory(gpu, t)
        else:
            assert status == k.ST_LIMIT, status

    def stopped(self, status: int, gpu: CompiledGPU, t: int) -> None:
        """A run() call stopped at an instant op (instant_stop) in the compute stream's loop that a
        compute op's completion of ``gpu`` began at ``t`` (:meth:`resumed`): after the loop, that
        completion's check (Shard._complete; CompiledGPU's fields, without its properties)."""
        shard = self.shard
        shard.now = t
        self.instant_stop(gpu, status, t)
        if gpu._susp and (gpu._sync is not None or gpu._mv[k.R_OUT] <= shard.max_ahead >> 1):
            shard._maybe_resume(gpu)

    def _apply_memory(self, gpu: VirtualGPU, proxy: Op) -> None:
        """What the block's allocs and frees leave on the rank's set of live allocations (Shard._instant
        row by row: an allocation the block frees again leaves nothing; the kernels counted the
        bytes)."""
        entry = proxy.mem
        if entry is not None:
            proxy.mem = None
            live = gpu.allocations
            live.update(entry[0])  # (as a loop of adds, then of discards, in C)
            live.difference_update(entry[1])

    def _out_of_memory(self, gpu: VirtualGPU, t: int) -> None:
        """Shard._instant's error for the alloc the kernels stopped at (G_RET_OP): the block's rows
        up to it applied one by one on the rank's set of live allocations."""
        pos = int(self.ops[self.gm[k.G_RET_OP], k.O_LOST])  # its row in the block
        proxy = self.proxies[gpu._ri]
        _, _, mem_rows, given = proxy.mem
        proxy.mem = None
        memory = list(given)
        live = gpu.allocations
        for row, slot, alloc, size, name in mem_rows:
            if row > pos:
                break
            if alloc:
                obj = memory[slot] = Allocation(memory[slot] if name is None else name, size)
                live.add(obj)
            else:
                live.discard(memory[slot])
        raise OutOfMemoryError(oom_message(gpu, obj, t))

    def run(self, limit: tuple | None, horizon: int) -> int:
        """Process events before ``limit`` (the shard's other heaps' next key) and ``horizon``."""
        if limit is None:
            k.run(self.args[0], _NO_LIMIT, 0, 0, 0, 0, horizon)
        else:
            k.run(self.args[0], *limit, horizon)
        # (_after, inline: a call every dozen events)
        g = self.gm
        if g[_G_ERR] or g[_G_NOVF]:
            self._overflowed()
        if g[_G_SENT] or g[_G_LOW] or g[_G_RDRAIN]:
            self._net_after()
        self.top = self.top_row[0] if g[_G_HEAPN] else INF
        status = g[_G_STATUS]
        if status == _ST_RMISMATCH:
            try:
                self._mismatch()
            except EmulatorError as exc:  # at the compute completion the kernels stopped at
                at_event(exc, (g[k.G_RET_T], EV_OP_DONE, self.ranks[g[k.G_RET_RI]]))
                raise
        return status

    def block_done(self) -> tuple[VirtualGPU, Op, int]:
        """The block whose last compute op the last call completed: its proxy becomes that op
        (duration, FLOPs, start) for Shard._complete."""
        g = self.gm
        ri = g[_G_RET_RI]
        gpu = self.shard.gpus[self.ranks[ri]]
        if gpu._mv[_R_ADONE]:
            self.settle(gpu)
        proxy = self.proxies[ri]
        if proxy.mem is not None:
            self._apply_memory(gpu, proxy)
        proxy.kind = COMPUTE
        proxy.t_start = g[_G_RET_TSTART]
        g[k.G_PREL] = 0  # (its completion starts the compute stream's next op before the program's check)
        return gpu, proxy, g[_G_RET_T]

    def settle(self, gpu: VirtualGPU) -> None:
        """The proxies of ``gpu``'s blocks that the kernels completed and started themselves
        (``EMULATOR_TAPE=blocks``: opstreams._chain) as Shard._complete and _try_start would have
        left them, before Python reads the rank's compute stream or live allocations: each done,
        off the stream, its allocations applied, its least duration in the stream's ``done_ns``
        (the kernels counted the rest); the stream's head started when the last one ended (the
        kernels' R_ASTART) and the rank's running proxy. A completed one left nothing else to
        Python: it had no dependents (Shard._launch_block_compiled's conditions)."""
        mv = gpu._mv
        n = mv[_R_ADONE]
        if not n:
            return
        mv[_R_ADONE] = 0
        stream = gpu.streams["compute"]
        pop = stream.ops.popleft
        # a settled proxy is off the stream and nothing holds it (no dependents, not the stream's
        # last: its head is after it, and the program holds no proxy), so only what it leaves is
        # written: its allocations, whose adds then discards, each in one call, leave the set the
        # per-proxy order would (an allocation is freed after it was made, and once), and its
        # duration; its own flags (done, started) no one reads again. test_tape_blocks.py checks
        # the proxies' kinds and dependents that the kernels' chain conditions guarantee
        adds: list = []
        drops: list = []
        done_ns = 0
        for _ in range(n):
            proxy = pop()
            entry = proxy.mem
            if entry is not None:  # (_apply_memory's, batched: most blocks allocate or free)
                adds += entry[0]
                drops += entry[1]
            done_ns += proxy.a
        if adds or drops:
            live = gpu.allocations
            live.update(adds)
            live.difference_update(drops)
        stream.done_ns += done_ns
        head = stream.ops[0]
        assert head.kind == BLOCK and not head.started and not head.deps_left and stream.blocked_since < 0, head
        head.started = True
        head.t_start = mv[k.R_ASTART]
        self.proxies[gpu._ri] = head

    def settle_all(self) -> None:
        """:meth:`settle` for every rank with proxies to settle (before figures or reports)."""
        gpus = self.shard.gpus
        for ri in np.flatnonzero(self.rs[:, k.R_ADONE]).tolist():
            self.settle(gpus[self.ranks[ri]])

    def resumed(self) -> tuple[VirtualGPU, int]:
        g = self.gm
        return self.shard.gpus[self.ranks[g[_G_RET_RI]]], g[_G_RET_T]

    # -- figures --------------------------------------------------------------------------------
    def flush(self) -> None:
        """Add the kernels' accumulators to the shard's figures (ShardStats.flush calls this)."""
        self.settle_all()  # (none left at a run's end: a tape's last proxy completes in Python)
        pl = self.pl
        netcore = self.shard.core
        for p, (acc, op_name) in enumerate(self.plan_info):
            calls, wait = int(pl[p, k.P_CALLS]), int(pl[p, k.P_MAXWAIT])
            if calls:
                acc[0] += calls
                if wait > acc[1]:
                    acc[1] = wait
                total = netcore.collective_ns.get(op_name)
                if total is None:
                    total = netcore.collective_ns[op_name] = [0, 0]
                total[0] += int(pl[p, k.P_CNS])
                total[1] += int(pl[p, k.P_CCOUNT])
            pl[p, k.P_CALLS] = pl[p, k.P_MAXWAIT] = pl[p, k.P_CNS] = pl[p, k.P_CCOUNT] = 0
        links = self.shard.links
        for link in np.flatnonzero(self.qm).tolist():
            links.queued_ns[link] += int(self.qn[link])
            links.queued_messages[link] += int(self.qm[link])
        self.qn[:] = 0
        self.qm[:] = 0
        line = self.shard.stats.timeline[0]
        for slot in np.flatnonzero(self.tl).tolist():
            line[slot] = line.get(slot, 0) + int(self.tl[slot])
        self.tl[:] = 0
        rs = self.rs
        gpus = self.shard.gpus
        # the kernels' share of the order-free totals (CompiledGPU): sums added, the latest time kept
        cols = [k.R_RANK, k.R_OPSDONE, k.R_LAST, k.R_CNS, k.R_COMMNS]
        for rank, done, last, cns, comm in rs[np.flatnonzero(rs[:, k.R_OPSDONE])][:, cols].tolist():
            gpu = gpus[rank]
            gpu.ops_done += done
            gpu.compute_ns += cns
            gpu.comm_ns += comm
            if last > gpu.last_time:
                gpu.last_time = last
        rs[:, k.R_OPSDONE] = rs[:, k.R_LAST] = rs[:, k.R_CNS] = rs[:, k.R_COMMNS] = 0
        lost = self.shard.compute_lost_ns
        for rank, ns in rs[np.flatnonzero(rs[:, k.R_LOST])][:, [k.R_RANK, k.R_LOST]].tolist():
            lost[rank] = lost.get(rank, 0) + ns
        rs[:, k.R_LOST] = 0
        for ri, names in self.slot_names.items():
            gpu = self.shard.gpus[self.ranks[ri]]
            for slot, name in enumerate(names):
                base = k.R_SS0 + slot * k.SS_FIELDS
                if rs[ri, base + k.SS_HIT]:
                    waits = gpu.wait_ns.setdefault(name, {})
                    waits["compute"] = waits.get("compute", 0) + int(rs[ri, base + k.SS_WAIT])
                    rs[ri, base + k.SS_HIT] = rs[ri, base + k.SS_WAIT] = 0
                if rs[ri, base + k.SS_CHIT]:  # the compute stream waited for this receive stream
                    waits = gpu.wait_ns.setdefault("compute", {})
                    waits[name] = waits.get(name, 0) + int(rs[ri, base + k.SS_CWAIT])
                    rs[ri, base + k.SS_CHIT] = rs[ri, base + k.SS_CWAIT] = 0
        for ri in np.flatnonzero(rs[:, k.R_WCT_HIT] | rs[:, k.R_WTC_HIT]).tolist():
            gpu = self.shard.gpus[int(rs[ri, k.R_RANK])]
            for hit, col, stream, by in _WAITS:
                if rs[ri, hit]:
                    waits = gpu.wait_ns.setdefault(stream, {})
                    waits[by] = waits.get(by, 0) + int(rs[ri, col])
                    rs[ri, hit] = rs[ri, col] = 0



# numpy asks the OS for transparent huge pages for an array from 4 MiB (madvise); where memory is
# fragmented, each first touch of a 2 MiB page then compacts memory inside the page fault. The op
# ring of a run without folding is that large (3,072 ranks: 200 MiB, touched a rank at a time), and
# the straggler run spent 0.44 s of system time in those faults (~4.7 ms each, 94 of them in its
# first receives) of its 5.5 s; small pages fault in a fraction of it, and the kernels' loop ran no slower.
_HUGE_BYTES = 4 << 20


def _zeros(n: int, dtype) -> np.ndarray:
    """``np.zeros(n, dtype)``; from :data:`_HUGE_BYTES` in a private anonymous mapping (zeros) that
    asks for small pages (numpy's own allocation asks for huge ones), which the array keeps alive
    as its base. Private: a forked process (a sweep's worker) gets its own copy, as of numpy's."""
    dtype = np.dtype(dtype)
    size = n * dtype.itemsize
    if size < _HUGE_BYTES:
        return np.zeros(n, dtype)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # (Linux; with THP "always" a private mapping would take huge pages)
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype, n)


def warm_up(net=None) -> None:
    """Load every kernel of opkernels.py (compiled on first use, then from numba's cache): called
    by netcore.warm_up, in the background thread that loads the collective kernels while a run
    starts, so that a first run's compile does not count as emulation time."""
    from types import SimpleNamespace

    links = SimpleNamespace(free=np.zeros(2, np.int64))
    shard = SimpleNamespace(gpus={0: None}, topo=SimpleNamespace(world_size=1), max_ahead=4,
                            stats=SimpleNamespace(bucket_ns=1000), links=links, compute_faults=None)  # fmt: skip
    core = OpCore(shard)
    core.ti[0] = (k.I_C, 5, 0)
    core.tp[0] = (0, 1)
    core._pack()
    core.rs[0, k.R_BEGIN] = 0
    k.launch_rest(*core.args, 0, 0)
    k.start_block(*core.args, 0, 0)
    k.cont(*core.args, 0, 0)
    k.run(*core.args, k.NO_LIMIT, 0, 0, 0, 0, k.NO_LIMIT)
    if net is not None:  # a send to rank 1 through netcore.warm_up's core (``net``), and its completion
        core.net = net.table
        core.enable_sends()
        core.sd[0] = (1, 0, net.rid(0, 1), 0, 0, 0)
        core.rs[0, k.R_SS0 + k.SS_HEAD] = core.rs[0, k.R_SS0 + k.SS_TAIL] = core.rs[0, k.R_SS0 + k.SS_BLK] = -1
        core._pack()
        k.launch_send(*core.args, 0, 0, 1, 0, 0)
        k.run(*core.args, k.NO_LIMIT, 0, 0, 0, 0, k.NO_LIMIT)
        core.rs[0, k.R_BEGIN] = 0  # a block and its send in one call (tape.py), both run
        k.launch_step(*core.args, 0, 0, 0, 1, 0, -1, 0)
        k.run(*core.args, k.NO_LIMIT, 0, 0, 0, 0, k.NO_LIMIT)
        k.launch_steps(*core.args, 0, 0, core.step_rows, 0)  # (no step: compiled, nothing launched)
        # a receive from rank 1 that waits, completed as at its hand-over
        base = k.R_SS0 + k.SS_FIELDS
        core.sd[1] = (1, 0, 0, 1, 1, 1)
        core.rs[0, base + k.SS_HEAD] = core.rs[0, base + k.SS_TAIL] = core.rs[0, base + k.SS_BLK] = -1
        k.launch_recv(*core.args, 0, 1, 1, 0, 0)
        k.complete_recv(*core.args, int(core.rs[0, base + k.SS_HEAD]), 0)
        k.run_net(*core.args, k.NO_LIMIT, 0, 0, 0, 0, k.NO_LIMIT)  # (the message core's run with receives)

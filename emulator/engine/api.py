"""The mock GPU API a rank's program is written against, in the style of torch.distributed.

    def program(gpu):
        grads = gpu.alloc(4 << 30, "grads")
        for _ in range(gpu.args.get("iterations", 2)):
            gpu.compute("forward", flops=2e12, bytes=1e9)
            work = gpu.all_reduce(1 << 30, async_op=True)   # overlaps the next compute
            gpu.compute("backward", flops=4e12, bytes=2e9)
            work.wait()
            gpu.mark_iteration()
        gpu.free(grads)

Every call launches work on a stream and returns at once; ``synchronize()`` is the only call that
waits (and returns the virtual time). Sizes are bytes, times nanoseconds.

Every size and time a program passes is checked where it is passed, so that a wrong one is one line
naming the rank and the call rather than a hang, a negative time or an overflow deep in the engine:
sizes are whole numbers of bytes, at least 0; a message or collective buffer is at most the GPU's
memory (where its buffer lives); a kernel lasts at most :data:`MAX_OP_NS`.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import Any

from emulator.engine.ops import ALLOC, COLL, COMPUTE, FREE, MARK, RECV, SEND, SYNC, Allocation, Handle, Op
from emulator.errors import ProgramError
from netmodel.collectives import ALGORITHMS, get_algorithm
from netmodel.collectives.base import OPS, CollectiveCall

# The longest kernel a program may launch: 2**50 ns, 13 days. Real kernels last microseconds to
# seconds; the bound keeps the sum of millions of ops far inside int64 virtual time.
MAX_OP_NS = 2**50

ALGO_CODES = {name: i for i, name in enumerate(sorted(ALGORITHMS))}
OP_CODES = {name: i for i, name in enumerate(OPS)}


class Group:
    """A process group: an explicit, ordered list of ranks (ring order for ring algorithms)."""

    __slots__ = ("ranks", "gid", "index", "tier", "one_node", "calls", "arrivals", "cross")

    def __init__(self, ranks: tuple[int, ...], tier: int, one_node: bool = False):
        self.ranks = ranks
        # a content digest: the same id on every shard whatever the creation order
        digest = hashlib.blake2b(repr(ranks).encode(), digest_size=8).digest()
        self.gid = int.from_bytes(digest, "big") >> 2 or 1
        self.index = {r: i for i, r in enumerate(ranks)}
        self.tier = tier
        self.one_node = one_node  # every member in one node: eligible for the intra-node fast path
        # (op, size, member index, root index, algo) -> (group, CollectiveCall, algorithm, signature,
        # closed form): programs repeat the same few calls thousands of times (GPU.prepare_collective)
        self.calls: dict[tuple, tuple] = {}
        self.arrivals = len(ranks)  # members that issue calls (fewer under symmetry folding)
        self.cross: tuple[int, ...] = ()  # the other shards its members live in (set by the shard)

    def __len__(self) -> int:
        return len(self.ranks)

    def __repr__(self) -> str:
        shown = ",".join(map(str, self.ranks[:8])) + (",..." if len(self.ranks) > 8 else "")
        return f"group[{shown}]"


class JobRanks:
    """Where the ranks of one job of a shared cluster live: job rank ``i`` is cluster rank
    ``ranks[i]`` (emulator/config/jobs.py)."""

    __slots__ = ("name", "ranks", "local", "precision")

    def __init__(self, name: str, ranks: tuple[int, ...], precision: str = "bf16"):
        self.name = name
        self.ranks = ranks
        self.precision = precision  # the job's training precision: what its compute kernels run at
        self.local = {r: i for i, r in enumerate(ranks)}


class GPU:
    """Handle a program receives: identity of the rank plus the launch calls.

    With ``job`` (a job of a shared cluster) the program sees the job's ranks: ``rank``,
    ``world_size``, ``world``, the ranks given to ``new_group``, ``send``, ``recv`` and a root are
    the job's own, mapped to cluster ranks here (group members and op names are cluster ranks).
    """

    def __init__(self, shard, vgpu, args: dict[str, Any], config: Any, job: JobRanks | None = None):
        """``config``: the run config (the job's, for a job), for the program (``gpu.config``); the
        engine reads ``shard.settings`` instead."""
        self._shard = shard
        self._gpu = vgpu
        self._job = job
        self._rank = vgpu.rank  # the cluster rank: the engine's
        topo = shard.topo
        self.rank: int = vgpu.rank if job is None else job.local[vgpu.rank]
        self.world_size: int = topo.world_size if job is None else len(job.ranks)
        self._who = f"rank {self.rank}" if job is None else f"job {job.name} rank {self.rank}"
        self.node: int = vgpu.node
        self.local_rank: int = topo.rank_local[vgpu.rank]
        self.gpus_per_node: int = topo.node_gpus[vgpu.node]
        self.gpu_type: str = topo.gpu_type(vgpu.rank)
        self.spec = vgpu.spec
        self.args = args
        self.config = config
        self.precision: str = shard.settings.precision if job is None else job.precision
        self.world: Group = shard.world_group() if job is None else shard.group(job.ranks)

    def for_job(self, job: JobRanks, args: dict[str, Any], config: Any) -> GPU:
        """This GPU as a rank of ``job`` sees it, for the job's program (``args``, ``config``)."""
        return GPU(self._shard, self._gpu, args, config, job)

    # -- groups ------------------------------------------------------------------------------
    def new_group(self, ranks) -> Group:
        """The process group of ``ranks`` (order matters: it is the ring order)."""
        ranks_arg = ranks
        # every member of a group asks for it: after the first, a ``range`` is found without
        # hashing its thousands of ranks again (tuples do not cache their hash); a job's ranges
        # are its own ranks, cached apart from the other jobs'
        by_range = self._shard.range_groups
        range_key = ranks if self._job is None else (self._job.name, ranks)
        known = by_range.get(range_key) if type(ranks) is range else None
        if known is None:
            ranks = tuple(ranks) if self._job is None else self._cluster_ranks(ranks)
            known = self._shard.groups.get(ranks)
        if known is not None and self._rank in known.index:
            return known
        ranks = tuple(int(r) for r in ranks)
        if self._rank not in ranks:
            raise ProgramError(f"{self._who}: new_group({list(ranks_arg)[:8]}...) does not contain this rank")
        if len(set(ranks)) != len(ranks) or min(ranks) < 0 or max(ranks) >= self._shard.topo.world_size:
            raise ProgramError(f"{self._who}: new_group has duplicate or out-of-range ranks")
        group = self._shard.group(ranks)
        if type(ranks_arg) is range:
            by_range[range_key] = group
        return group

    def _cluster_ranks(self, ranks) -> tuple[int, ...]:
        """A job's ranks as cluster ranks (out-of-range ones are a ProgramError)."""
        job = self._job.ranks
        try:
            return tuple(job[int(r)] if r >= 0 else -1 for r in ranks)
        except IndexError:
            raise ProgramError(f"{self._who}: new_group has duplicate or out-of-range ranks") from None

    # -- launches ----------------------------------------------------------------------------
    def compute(self, name: str = "compute", *, flops: float = 0.0, bytes: float = 0.0, kind: str = "matmul",
                duration_ns: int | None = None, stream: str = "compute") -> Handle:  # fmt: skip
        """Launch a kernel of ``flops`` and ``bytes`` of HBM traffic (or an explicit duration)."""
        if duration_ns is None:
            for label, value in (("flops", flops), ("bytes", bytes)):
                if not (isinstance(value, numbers.Real) and 0 <= value < math.inf):
                    raise ProgramError(f"{self._who}: compute({name!r}) {label} must be a finite number >= 0, "
                                       f"got {value!r}")  # fmt: skip
            duration_ns = self._shard.compute_time_ns(self._gpu, flops, bytes, kind, self.precision)
            if duration_ns > MAX_OP_NS:
                raise ProgramError(f"{self._who}: compute({name!r}) would last {duration_ns / 1e9:.3g} s, longer "
                                   f"than {MAX_OP_NS / 1e9:.3g} s: check its flops and bytes")  # fmt: skip
        else:
            duration_ns = self.compute_ns(name, duration_ns)
        return self.launch_compute(name, int(duration_ns), flops, stream)

    def send(self, dst: int, size_bytes: int, *, tag: int = 0, async_op: bool = False,
             stream: str = "comm") -> Handle:  # fmt: skip
        """Send ``size_bytes`` to rank ``dst``; matched with its recv by (source, tag, order)."""
        return self._blocking(self.launch_p2p(self.prepare_p2p("send", dst, size_bytes, tag), stream), async_op)

    def recv(self, src: int, size_bytes: int, *, tag: int = 0, async_op: bool = False,
             stream: str = "comm") -> Handle:  # fmt: skip
        """Receive ``size_bytes`` from rank ``src``; completes when the message has arrived."""
        return self._blocking(self.launch_p2p(self.prepare_p2p("recv", src, size_bytes, tag), stream), async_op)

    def prepare_p2p(self, kind: str, peer: int, size_bytes: int, tag: int = 0) -> tuple:
        """Check a ``"send"`` or ``"recv"`` of this rank once: what :meth:`launch_p2p` launches (the
        built-in workload prepares its pipeline messages once and launches them every microbatch)."""
        peer = self._check_peer(peer, kind)
        size_bytes = self._buffer_size(size_bytes, kind)
        if kind == "send":
            return SEND, f"send(dst={peer}, tag={tag}, {size_bytes} B)", peer, size_bytes, tag
        return RECV, f"recv(src={peer}, tag={tag}, {size_bytes} B)", peer, size_bytes, tag

    def launch_p2p(self, prepared: tuple, stream: str) -> Handle:
        """Launch a send or receive :meth:`prepare_p2p` checked, on ``stream``; returns its handle."""
        op = Op(*prepared)
        self._shard.launch(self._gpu, op, stream, True)
        return op

    def all_reduce(self, size_bytes: int, group: Group | None = None, **kw) -> Handle:
        return self._collective("all_reduce", size_bytes, group, **kw)

    def reduce_scatter(self, size_bytes: int, group: Group | None = None, **kw) -> Handle:
        """``size_bytes`` is the whole input; each member keeps size/n (nccl-tests convention)."""
        return self._collective("reduce_scatter", size_bytes, group, **kw)

    def all_gather(self, size_bytes: int, group: Group | None = None, **kw) -> Handle:
        """``size_bytes`` is the gathered total; each member contributes size/n."""
        return self._collective("all_gather", size_bytes, group, **kw)

    def broadcast(self, size_bytes: int, root: int, group: Group | None = None, **kw) -> Handle:
        return self._collective("broadcast", size_bytes, group, root=root, **kw)

    def reduce(self, size_bytes: int, root: int, group: Group | None = None, **kw) -> Handle:
        return self._collective("reduce", size_bytes, group, root=root, **kw)

    def all_to_all(self, size_bytes: int, group: Group | None = None, **kw) -> Handle:
        """``size_bytes`` is each member's send buffer; size/n goes to every member."""
        return self._collective("all_to_all", size_bytes, group, **kw)

    def barrier(self, group: Group | None = None, **kw) -> Handle:
        return self._collective("barrier", 0, group, **kw)

    def alloc(self, size_bytes: int, name: str = "tensor") -> Allocation:
        """Reserve memory; exceeding the GPU's capacity is an out-of-memory error."""
        block = Allocation(name, self._whole_bytes(size_bytes, f"alloc({name!r})"))
        self._launch(Op(ALLOC, f"alloc({name})", block), "compute", comm=False)
        return block

    def free(self, block: Allocation) -> None:
        if block.freed:
            raise ProgramError(f"{self._who}: {block.name} freed twice")
        block.freed = True
        self._launch(Op(FREE, f"free({block.name})", block), "compute", comm=False)

    def mark_iteration(self) -> None:
        """An iteration boundary, reached when every stream has drained up to here."""
        self._launch(Op(MARK, "mark_iteration"), "compute", comm=False, after_all=True)

    def synchronize(self) -> int:
        """Block until every stream has drained; returns the virtual time in nanoseconds."""
        op = self._launch(Op(SYNC, "synchronize"), "compute", comm=False, after_all=True)
        self._shard.wait_for(self._gpu, op)
        return op.t_end

    # -- internals ---------------------------------------------------------------------------
    def _whole_bytes(self, size_bytes, what: str) -> int:
        """``size_bytes`` as an int: a whole number (numpy integers, and integral floats such as 1e6,
        too), at least 0."""
        if type(size_bytes) is int and size_bytes >= 0:  # the common case, without the ABC checks below
            return size_bytes
        whole = isinstance(size_bytes, numbers.Integral) or (
            isinstance(size_bytes, numbers.Real) and math.isfinite(size_bytes) and float(size_bytes).is_integer()
        )
        if isinstance(size_bytes, bool) or not whole:
            raise ProgramError(f"{self._who}: {what} size_bytes must be a whole number of bytes, got {size_bytes!r}")
        if size_bytes < 0:
            raise ProgramError(f"{self._who}: {what} size_bytes must be >= 0, got {size_bytes!r}")
        return int(size_bytes)

    def _buffer_size(self, size_bytes, what: str) -> int:
        """A message's or collective's size: whole bytes, and no larger than this GPU's memory,
        where its buffer has to live."""
        size = self._whole_bytes(size_bytes, what)
        capacity = self._gpu.capacity_bytes
        if size > capacity:
            raise ProgramError(f"{self._who}: {what} of {size:,} bytes is larger than the GPU's memory "
                               f"({capacity:,} bytes, {self.gpu_type}), where its buffer would live")  # fmt: skip
        return size

    def _check_peer(self, peer: int, what: str) -> int:
        """The cluster rank of ``peer``, another rank of the program's world."""
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ProgramError(f"{self._who}: {what} peer {peer} is not another rank of 0..{self.world_size - 1}")
        return peer if self._job is None else self._job.ranks[peer]

    def _collective(self, op: str, size_bytes: int, group: Group | None, *, root: int | None = None,
                    algo: str | None = None, async_op: bool = False, stream: str = "comm") -> Handle:  # fmt: skip
        prepared = self.prepare_collective(op, size_bytes, group, root=root, algo=algo)
        return self._blocking(self.launch_collective(prepared, stream), async_op)

    def prepare_collective(self, op: str, size_bytes: int, group: Group | None, *, root: int | None = None,
                           algo: str | None = None) -> tuple:  # fmt: skip
        """Check a collective call of this rank once: ``(group, call, algorithm, signature, closed
        form)``, what :meth:`launch_collective` launches (the built-in workload prepares its
        layer's calls once and launches them for every microbatch)."""
        group = group or self.world
        index = group.index.get(self._rank)
        if index is None:
            raise ProgramError(f"{self._who}: {op} on {group}, which does not contain this rank")
        root_index = 0
        if root is not None:
            member = root if self._job is None or not 0 <= root < self.world_size else self._job.ranks[root]
            if member not in group.index:
                raise ProgramError(f"{self._who}: {op} root {root} is not a member of {group}")
            root_index = group.index[member]
        key = (op, size_bytes, index, root_index, algo)
        cached = group.calls.get(key)
        if cached is None:
            size_bytes = self._buffer_size(size_bytes, op)
            name = algo or self._shard.default_algorithm(op, group)
            algorithm = get_algorithm(name, op)
            call = CollectiveCall(op, size_bytes, group.ranks, index, root_index)
            # the signature every message of this call carries, so members can check they agree
            sig = OP_CODES[op] | ALGO_CODES[name] << 4 | root_index << 8 | size_bytes << 28
            cached = group.calls[key] = (group, call, algorithm, sig, self._shard.closed_form(call, algorithm, group))
        return cached

    def launch_collective(self, prepared: tuple, stream: str) -> Handle:
        """Launch a collective :meth:`prepare_collective` checked, on ``stream``; returns its handle."""
        group, call, algorithm, sig, closed = prepared
        gpu = self._gpu
        gid = group.gid
        seq = gpu.coll_seq.get(gid, 0)
        gpu.coll_seq[gid] = seq + 1
        op_obj = Op(COLL, None, call, algorithm, (gid, seq), sig)
        op_obj.cross = group.cross
        op_obj.dl = closed  # (duration, arrivals) of a closed-form call, or None; launch() makes it a delay
        self._shard.launch(gpu, op_obj, stream, True)
        return op_obj

    def launch_block(self, block: list, memory: list | None = None, suffix: str = "") -> bool:
        """Launch a block of tensor_parallel.prepare_segments in the compiled per-op engine
        (emulator/engine/opcore.py); False when it does not run there (launch it op by op).
        ``memory``: its alloc and free rows' allocations, ``suffix``: its compute ops' names'
        (tensor_parallel.launch_prepared)."""
        core = self._shard.ops_core
        if core is None or self._gpu.trace is not None:
            return False
        core.suffix = suffix
        return core.launch(self._gpu, block, memory)

    def takes_tapes(self) -> bool:
        """Whether this rank's plain pipeline steps can run from tapes (emulator/engine/tape.py)."""
        return self._shard.tapes_on and self._gpu.trace is None

    def tape_block(self, block: list):
        """The compiled per-op engine's entry for a block of tensor_parallel.prepare_segments when
        this rank's plain pipeline steps can run from a tape with it (emulator/engine/tape.py), else
        None (launch it with launch_prepared)."""
        core = self._shard.ops_core
        known = core.known(self._gpu, block)
        return known if core.eligible(self._gpu, known) else None

    def run_tape(self, steps: list, held: dict) -> None:
        """Launch a run of pipeline steps (emulator/engine/tape.py: each a receive, a block that
        :meth:`tape_block` took, a send) as launching them one by one would."""
        self._shard.run_tape(self._gpu, steps, held)

    def compute_ns(self, name: str, duration_ns) -> int:
        """A kernel's explicit duration, checked (a ProgramError unless 0 <= ns <= MAX_OP_NS)."""
        if not (isinstance(duration_ns, numbers.Real) and 0 <= duration_ns <= MAX_OP_NS):
            raise ProgramError(f"{self._who}: compute({name!r}) duration_ns must be between 0 and {MAX_OP_NS:,} "
                               f"(13 days), got {duration_ns!r}")  # fmt: skip
        return int(duration_ns)

    def launch_compute(self, name: str, duration_ns: int, flops: float, stream: str = "compute") -> Handle:
        """Launch a kernel whose duration :meth:`compute_ns` checked (the built-in workload's
        prepared layers); ``compute`` is this plus the checks."""
        op = Op(COMPUTE, name, duration_ns, flops)
        self._shard.launch(self._gpu, op, stream)
        return op

    def _blocking(self, handle: Handle, async_op: bool) -> Handle:
        if not async_op:
            handle.wait()
        return handle

    def _launch(self, op: Op, stream: str, comm: bool, after_all: bool = False) -> Handle:
        self._shard.launch(self._gpu, op, stream, comm, after_all)
        return op

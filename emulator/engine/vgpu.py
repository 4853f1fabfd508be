"""A virtual GPU: a plain object holding a rank's clock-relevant state.

No tensors, no threads: streams of launched operations, a mailbox of size-only messages, memory
accounting and counters. The rank's program runs in a greenlet that the shard switches into.
"""

from __future__ import annotations

from collections import deque


class Stream:
    """A FIFO of launched operations; only the head runs."""

    __slots__ = ("name", "ops", "last", "blocked_since", "unblocked_by", "launched_ns", "done_ns")

    def __init__(self, name: str):
        self.name = name
        self.ops: deque = deque()
        self.last = None  # the most recently launched op (a dependency for later launches)
        self.blocked_since = -1  # when the head op started waiting on another stream (-1: not waiting)
        self.unblocked_by = ""  # stream of the dependency that released the head
        # durations of the compute ops launched on / completed by this stream (lookahead bounds)
        self.launched_ns = 0
        self.done_ns = 0


class VirtualGPU:
    """State of one rank; the :class:`~emulator.engine.shard.Shard` owning it drives it."""

    __slots__ = (
        "rank", "node", "spec", "capacity_bytes", "streams", "pending_waits", "outstanding",
        "greenlet", "suspended", "sync_op", "finished", "seq", "mailbox", "waiters",
        "coll_seq", "p2p_send", "p2p_recv", "mem_used", "mem_peak", "allocations", "marks",
        "ops_done", "compute_ns", "flops_done", "comm_ns", "last_time", "wait_ns", "trace", "cross_queued",
    )  # fmt: skip

    def __init__(self, rank: int, node: int, spec, capacity_bytes: int):
        self.rank = rank
        self.node = node
        self.spec = spec
        self.capacity_bytes = capacity_bytes
        self.streams: dict[str, Stream] = {}
        self.pending_waits: dict[str, list] = {}  # stream -> ops its next launch must wait for
        self.outstanding = 0  # launched, not completed
        self.greenlet = None
        self.suspended = False
        self.sync_op = None  # the op a synchronize() call waits for
        self.finished = False  # program returned
        self.seq = 0  # event counter: part of every event key this GPU creates
        self.mailbox: dict[tuple, tuple] = {}  # message key -> (delivery_ns, size, sig)
        self.waiters: dict[tuple, object] = {}  # message key -> recv op or collective channel
        self.coll_seq: dict[int, int] = {}  # group id -> collectives issued on it
        self.p2p_send: dict[tuple[int, int], int] = {}  # (dst, tag) -> messages sent
        self.p2p_recv: dict[tuple[int, int], int] = {}
        self.mem_used = 0
        self.mem_peak = 0
        self.allocations: set = set()
        self.marks: list[int] = []  # virtual time of each iteration boundary
        self.ops_done = 0
        self.compute_ns = 0
        self.flops_done = 0.0  # FLOPs of the compute ops completed (hardware FLOPs)
        self.comm_ns = 0
        self.last_time = 0  # completion time of the latest op
        # time a stream's head waited for another stream, by stream: {"compute": {"pp": ns, "dp": ns}}
        # (the compute stream waiting on the pipeline stream is bubble; on "tp"/"dp", exposed comm)
        self.wait_ns: dict[str, dict[str, int]] = {}
        self.trace: list | None = None  # (stream, name, kind, start_ns, end_ns) when this rank is traced
        self.cross_queued: list = []  # launched sends and collectives that can reach another shard

    def stream(self, name: str) -> Stream:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = Stream(name)
        return s


def oom_message(gpu: VirtualGPU, block, t: int) -> str:
    """The out-of-memory error's line for ``block`` allocated on ``gpu`` at ``t`` (ns): the use it
    brings, the capacity and the largest live allocations (Shard._instant, and the compiled
    engine's allocs, opcore.OpCore._out_of_memory)."""
    live = sorted(gpu.allocations, key=lambda b: (-b.size_bytes, b.name))[:3]  # names break ties: set order varies
    top = ", ".join(f"{b.name} {b.size_bytes / 2**30:.2f} GiB" for b in live)
    return (
        f"out of memory on rank {gpu.rank} at t={t / 1e9:.6f} s: allocating {block.name} "
        f"({block.size_bytes / 2**30:.2f} GiB) brings use to {gpu.mem_used / 2**30:.2f} GiB of "
        f"{gpu.capacity_bytes / 2**30:.2f} GiB ({gpu.spec.name}); largest live: {top}"
    )

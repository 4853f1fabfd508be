"""Operations a program enqueues on its GPU's streams, and the handles it gets back.

As on a real GPU, the program (the host) only *launches* work: every call returns at once and the
work runs on a stream in order. Dependencies follow CUDA / torch.distributed semantics:

- a compute op waits for the previous op on its stream and for every handle ``wait()``-ed since;
- a communication op waits for the previous op on its stream *and* for the compute stream's work
  launched before it (the data it sends is produced there), which is what lets gradient buckets
  overlap the rest of the backward pass;
- ``handle.wait()`` makes the compute stream's next op wait for the handle; a blocking call
  (``async_op=False``) is a launch followed by ``wait()``.
"""

from __future__ import annotations

COMPUTE, SEND, RECV, COLL, ALLOC, FREE, MARK, SYNC = range(8)
# a block of ops run by the compiled per-op engine (emulator/engine/opcore.py): its proxy on the
# shard's compute stream, which becomes its last compute op when it completes
BLOCK = 8
KIND_NAMES = ("compute", "send", "recv", "collective", "alloc", "free", "mark_iteration", "synchronize", "block")
COMM_KINDS = frozenset({SEND, RECV, COLL})


class Op:
    """One launched operation; ``a``/``b``/``c``/``d`` hold the kind's arguments (see Shard).

    For the shard's lookahead (emulator/engine/lookahead.py): ``cum`` is the sum of the durations of
    the compute ops launched on its stream up to it; ``cross`` holds the other shards a send or
    collective can reach (empty: none), and ``cdep`` is the compute-stream op it waits for; ``dl``
    is the least compute time between a message arriving and this op ending (``ds``: starting).
    """

    __slots__ = (
        "kind",
        "name",
        "stream",
        "deps_left",
        "dependents",
        "done",
        "started",
        "t_start",
        "t_end",
        "a",
        "b",
        "c",
        "d",
        "gpu",
        "cum",
        "cdep",
        "cross",
        "dl",
        "ds",
        "mem",  # a compiled block's proxy: what its allocs and frees leave (opcore.OpCore._proxy), or None
    )

    def __init__(self, kind: int, name: str, a=None, b=None, c=None, d=None):
        self.kind = kind
        self.name = name
        self.stream = None
        self.deps_left = 0
        self.dependents: list[Op] | None = None
        self.done = False
        self.started = False
        self.t_start = 0
        self.t_end = 0
        self.a, self.b, self.c, self.d = a, b, c, d
        self.cross = ()

    def describe(self) -> str:
        """Readable name; collectives build theirs only when asked (errors, traces)."""
        if self.name is None and self.kind == COLL:
            call, (_, seq) = self.a, self.c
            shown = ",".join(map(str, call.ranks[:8])) + (",..." if len(call.ranks) > 8 else "")
            self.name = f"{call.op} #{seq} on group[{shown}] ({call.size_bytes} B, {self.b.name})"
        return self.name

    def wait(self, stream: str = "compute") -> None:
        """Make ``stream``'s next operation wait for this one (the host does not block)."""
        if not self.done:
            waits = self.gpu.pending_waits
            pending = waits.get(stream)
            if pending is None:
                waits[stream] = [self]
            else:
                pending.append(self)

    def __repr__(self) -> str:
        return f"<Handle {self.describe()}>"


class BlockProxy(Op):
    """A compiled block's proxy (opcore.OpCore._proxy): an Op of kind BLOCK that also keeps the
    block's entry (OpCore.known) and the suffix its compute ops' names take (launch_prepared's), so
    that a deadlock report can name the block's ops as the Python op engine names them (diagnose.py)."""

    __slots__ = ("known", "suffix")

    def __init__(self, figures: tuple, known: tuple, suffix: str):
        # Op.__init__'s fields (kind BLOCK, no name) and the proxy's own in one frame: a proxy is made
        # for every block a tape launches (the straggler variant: about 190,000), so the second call's
        # frame and the stores after it were a measurable share of the tape's Python per step
        self.kind = BLOCK
        self.name = None
        self.stream = None
        self.deps_left = 0
        self.dependents = None
        self.done = False
        self.started = False
        self.t_start = 0
        self.t_end = 0
        self.a, self.b, self.c, self.d = figures  # (OpCore.known's: least duration, FLOPs, nominal, reset)
        self.cross = ()
        self.mem = None
        self.known = known
        self.suffix = suffix


# What a launch returns: the operation itself, whose ``wait()`` orders later work after it (one
# object per launch instead of two: launches are the hot path of every program).
Handle = Op


class Allocation:
    """A live block of GPU memory, returned by ``gpu.alloc`` and released by ``gpu.free``."""

    __slots__ = ("name", "size_bytes", "freed")

    def __init__(self, name: str, size_bytes: int):
        self.name = name
        self.size_bytes = size_bytes
        self.freed = False

    def __repr__(self) -> str:
        return f"<Allocation {self.name} {self.size_bytes} B>"

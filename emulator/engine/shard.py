"""A shard: many virtual GPUs, the links their nodes own, and one event heap.

The inline backend runs one shard holding every rank; the Ray backend runs the same class in N
actors. Events are processed in the total order of their key ``(time_ns, kind, rank, origin,
seq)``, whose parts are all derived from the emulated run (never from dict order, wall clock or
which shard ran first), and a shard only touches the state of its own GPUs and links. Every
message - even inside a node - reaches its receiver through a *handover* event at
``start + latency``, so a run is the same bit for bit whether sender and receiver share a shard.

Messages: the sender reserves its up-links (FIFO, cut-through) at send time; the receiver reserves
its down-links at the handover; delivery is ``max(end_up + latency, start_down + size/bw_down)``.
These rules, degraded and failed links included, are the link model's (netmodel/links.py), which
holds the shard's link state for both collective engines.

Message-level collectives run in the compiled core (emulator/engine/netcore.py, netkernels.py), which keeps its own
heap of the same keyed events; :meth:`Shard.run_until` merges the two heaps by key, so that the
order - hence every result - is the one of the Python reference path (``engine.collective_engine:
python``, emulator/engine/collective_run.py).
"""

from __future__ import annotations

import heapq
import math
import time

from greenlet import greenlet

from emulator.engine.api import GPU, Group
from emulator.engine.collective_run import CollectiveExecution
from emulator.engine.dedicated import DedicatedRules
from emulator.engine.diagnose import blocked_ranks
from emulator.engine.events import EV_HANDOVER, EV_OP_DONE, EV_STEP, INF, START, at_event
from emulator.engine.faults import ComputeFaults, Failures
from emulator.engine.folding import is_representative
from emulator.engine.live_figures import live_stats
from emulator.engine.lookahead import output_bound
from emulator.engine.netcore import NetCore
from emulator.engine.netkernels import COMPLETE, GROW, MISMATCH, NO_LIMIT, RECV_DONE, RET_RANK, RET_T
from emulator.engine.opkernels import R_ADONE
from emulator.engine.opmessages import KSENDS
from emulator.engine.ops import ALLOC, BLOCK, COLL, COMM_KINDS, COMPUTE, FREE, MARK, RECV, SEND, SYNC, Op
from emulator.engine.p2p import PointToPoint
from emulator.engine.settings import EngineSettings
from emulator.engine.stats import ShardStats
from emulator.engine.tape import Tape
from emulator.engine.tape import batched_steps as tape_batched_steps
from emulator.engine.tape import enabled as tape_enabled
from emulator.engine.tape import fused_steps as tape_fused_steps
from emulator.engine.tape import kernel_blocks as tape_kernel_blocks
from emulator.engine.tape import kernel_receives as tape_kernel_receives
from emulator.engine.tape import kernel_sends as tape_kernel_sends
from emulator.engine.vgpu import VirtualGPU, oom_message
from emulator.errors import EmulatorError, OutOfMemoryError, ProgramError
from emulator.hardware.compute import op_duration_ns
from emulator.hardware.gpus import get_gpu
from netmodel.collectives import DEFAULTS
from netmodel.collectives.analytic import ANALYTIC
from netmodel.links import LinkModel


class Shard(DedicatedRules, PointToPoint, CollectiveExecution):
    """Hosts the virtual GPUs of whole nodes; processes events before a horizon on request."""

    # a shard that runs the compiled per-op engine takes the dedicated variants of its hottest rules
    # (``*_compiled``: dedicated.py, a mixin); False: the generic ones (tests compare both)
    dedicated = True

    def __init__(self, topo, ranks, rank_shard, index, program, settings: EngineSettings, program_args=None,
                 trace_ranks=(), fold=1, run_config=None):  # fmt: skip
        """``settings``: what the engine needs of the run (emulator/engine/settings.py);
        ``run_config``: handed to the programs as ``gpu.config``, never read here."""
        self.topo = topo
        # symmetry folding (emulator/engine/folding.py): host only each tensor group's representative
        self.fold = fold
        ranks = [r for r in ranks if is_representative(r, fold)]
        self.trace_requested = set(trace_ranks)
        trace_ranks = {r - r % fold for r in trace_ranks}
        self.index = index
        self.rank_shard = rank_shard
        self.shards = max(rank_shard) + 1  # shards of the run (bounds are needed when there are several)
        self.settings = settings
        self.run_config = run_config
        self.max_ahead = settings.max_ops_ahead
        self.heap: list = []
        self.failures = Failures.for_faults(settings.faults, topo)
        self.fail_from_ns = self.failures.first_ns if self.failures is not None else INF
        # the shard's links: state, rules and totals, shared by every path that sends messages
        self.links = LinkModel(topo, self.failures.link_ns if self.failures is not None else None)
        self.stats = ShardStats(topo, settings.timeline_bucket_ns, self.links)
        # message-level collectives run in the compiled core (netcore.py) unless the reference
        # Python path is asked for; both share the link state and the per-sender message counters
        self.core = NetCore(topo, index, rank_shard, fold, self.stats)
        self.stats.core = self.core
        # a node or GPU failure (emulator/engine/faults.py) is honoured on the Python path only: the
        # compiled core keeps no failed-GPU state (both give the same results, the Python path slower)
        self.compiled = settings.collective_engine == "compiled" and self.failures is None
        self.mseq = self.core.mseq_py
        self.outbox: dict[int, list] = {}
        self.rendezvous: dict[tuple, list] = {}  # (group id, call #) -> members arrived (fast path)
        self.group_ports: dict[tuple, tuple] = {}  # one-node group -> its ports (fast path)
        self.closed_plans: dict[int, tuple] = {}  # id(call) -> its closed-form plan (fast path)
        self.fast_collectives = settings.fast_collectives
        self.groups: dict[tuple, Group] = {}
        self.range_groups: dict[range, Group] = {}  # new_group(range(...)) -> its group
        self._world: Group | None = None
        self.events = 0
        self.busy_s = 0.0  # wall seconds spent in start() and step(): what a host of its own would need
        self.now = 0
        self.done_until = 0  # every event stamped before it is processed (the last horizon reached)
        self.cross_runs: dict[int, int] = {}  # rank -> its started collectives whose group spans shards
        self.least_durations: dict[tuple, tuple] = {}  # (call, algorithm, rank) -> (call, ns) (lookahead.py)
        self.gpus: dict[int, VirtualGPU] = {}
        for rank in ranks:
            spec = get_gpu(topo.gpu_type(rank))
            self.gpus[rank] = VirtualGPU(rank, topo.rank_node[rank], spec, spec.hbm_bytes)
        for rank in trace_ranks:
            if rank in self.gpus:
                self.gpus[rank].trace = []
        self.program = program
        self.program_args = program_args if program_args is not None else {}
        # slow GPUs and jitter of the hosted ranks (emulator/engine/faults.py); None: every kernel nominal
        self.compute_faults = ComputeFaults.for_faults(settings.faults, topo, self.gpus)
        self.compute_lost_ns: dict[int, int] = {}  # rank -> charged minus nominal compute (faults)
        # the compiled per-op engine (emulator/engine/opcore.py) where it applies
        self.ops_core = None
        # only with tensor groups (tensor > 1, folded or not: unfolded, the kernels take each member's
        # arrival): with tensor 1 every block is one compute op, the kernels save nothing while the
        # CompiledGPU counters slow every op the Python rules run. Slow GPUs: only whole-run factors
        # (a kernel's duration as launched is then fixed, the templates take it); jitter (a draw per
        # kernel) and slowdown windows (a factor per start) run the Python rules
        faults = self.compute_faults
        if (settings.op_engine == "compiled" and settings.builtin_workload and settings.tensor_only_blocks
                and settings.tensor > 1
                and self.failures is None and (faults is None or not (faults.jitter or faults.windows))
                and self._closed_tensor_ops()):  # fmt: skip
            self._compile_ops()
        self._compile_messages()  # point-to-point messages through the compiled core (p2p.py)
        # the built-in program's plain pipeline steps run from tapes (tape.py) where the kernels
        # take its blocks; rank -> its tape while one runs
        self.tapes_on = self.ops_core is not None and tape_enabled(settings.tape)
        self.tapes: dict[int, Tape] = {}
        # a tape's pipeline sends to ranks of this shard run in the kernels (OpCore.launch_send); one
        # to another shard stays a Python op, which the lookahead reads (lookahead.py: cross_queued)
        self.kernel_sends = self.tapes_on and self.p2p_core and tape_kernel_sends(settings.tape)
        # and its receives, on one shard (OpCore.launch_recv)
        self.kernel_receives = self.kernel_sends and self.shards == 1 and tape_kernel_receives(settings.tape)
        # and a step's block, send and next receive in one kernel call (OpCore.launch_step)
        self.fused_steps = self.kernel_sends and tape_fused_steps(settings.tape)
        # a tape's block queued behind another starts in the kernels where that one ends, its proxy
        # settled by Python later (EMULATOR_TAPE=blocks: opstreams._chain, OpCore.settle); one shard
        # (the lookahead of several reads the compute streams' ops), the dedicated rules only
        self.chain_blocks = self.kernel_receives and self.fused_steps and tape_kernel_blocks(settings.tape)
        if self.kernel_sends:
            self.ops_core.enable_sends()
        if self.ops_core is not None and self.dedicated:
            # its GPUs are CompiledGPUs: the variants of the hot rules that read and write their
            # shared counters in the kernels' rows directly, not through the properties, and the
            # tapes' launches with the rules of their op kinds only (the same rules: test_opcore.py
            # and test_tape.py compare with the Python path, test_tape_dedicated.py with these off)
            self._complete = self._complete_compiled
            self.launch_p2p = self._launch_p2p_compiled
            self.launch_block = self._launch_block_compiled
        # a run of a tape's chained steps launched in one kernel call (EMULATOR_TAPE=arrays,
        # OpCore.launch_steps), their proxies made after it: the dedicated rules' launches only
        self.batch_steps = self.chain_blocks and self.dedicated and tape_batched_steps(settings.tape)

    def _closed_tensor_ops(self) -> bool:
        """Whether every node group runs the tensor group's collectives with analytic algorithms (so
        a rank's tensor collectives are all in closed form or none is: opcore.py takes all or none)."""
        return self.fast_collectives and all(
            ((g.scale_up.algorithms.get(op) or DEFAULTS[op]), op) in ANALYTIC
            for g in self.topo.groups
            for op in ("all_reduce", "reduce_scatter", "all_gather")
        )

    def _compile_ops(self) -> None:
        """Hand the hosted GPUs' counters to a compiled engine (before any program runs)."""
        from emulator.engine.opcore import CompiledGPU, OpCore

        self.ops_core = core = OpCore(self)
        for rank, old in list(self.gpus.items()):
            gpu = self.gpus[rank] = CompiledGPU(rank, old.node, old.spec, old.capacity_bytes, core)
            gpu.trace = old.trace
        self.stats.ops_core = core

    # -- programs ------------------------------------------------------------------------------
    def start(self) -> tuple[float, float, dict[int, list], float]:
        """Run every program up to its first suspension, in rank order, at virtual time 0;
        returns what :meth:`step` does (with the messages the first launches sent)."""
        started = time.perf_counter()
        for rank in sorted(self.gpus):
            gpu = self.gpus[rank]
            api = GPU(self, gpu, self.program_args, self.run_config)
            gpu.greenlet = greenlet(self._program_main)
            try:
                self._switch(gpu, api)
            except EmulatorError as exc:  # the starts come before every event, in rank order
                at_event(exc, (0, START, rank))
                raise
        return self._reply(started, self._take_outbox())

    def step(self, horizon: float, inbound: list[list]) -> tuple[float, float, dict[int, list], float]:
        """One round (emulator/engine/coordinator.py): accept ``inbound`` batches (in source-shard
        order), process every event before ``horizon``; returns ``(next event time, output bound,
        {destination shard: records}, wall seconds this call took)``."""
        started = time.perf_counter()
        for records in inbound:
            self.deliver(records)
        return self._reply(started, self.run_until(horizon))

    def _reply(self, started: float, out: dict) -> tuple[float, float, dict[int, list], float]:
        next_time, bound = self.next_time(), self.output_bound()
        busy = time.perf_counter() - started
        self.busy_s += busy
        return next_time, bound, out, busy

    def output_bound(self) -> tuple[list[float], float]:
        """Lower bounds on this shard's next send to each shard, and the least delay from an
        arrival to a send (emulator/engine/lookahead.py)."""
        return output_bound(self) if self.shards > 1 else ([INF], INF)

    def _program_main(self, api: GPU) -> None:
        self.program(api)
        api._gpu.finished = True

    def _switch(self, gpu: VirtualGPU, *args) -> None:
        gpu.suspended = False
        try:
            gpu.greenlet.switch(*args)
        except EmulatorError:
            raise
        except Exception as exc:  # a bug in the user's program is the user's to fix
            raise ProgramError(f"rank {gpu.rank}: program raised {_describe_exception(exc)}") from exc

    def wait_for(self, gpu: VirtualGPU, op: Op) -> None:
        """Called from a program: suspend it until ``op`` completes."""
        if not op.done:
            gpu.sync_op = op
            self._suspend(gpu)

    def _suspend(self, gpu: VirtualGPU) -> None:
        gpu.suspended = True
        if gpu.rank not in self.tapes:  # a tape keeps its place itself (Tape.run returns)
            gpu.greenlet.parent.switch()

    def run_tape(self, gpu: VirtualGPU, steps: list, held: dict) -> None:
        """Called from a program: launch ``steps`` (tape.py) as the program would; return when the
        last one is launched (the program suspended meanwhile: :meth:`_maybe_resume` runs them)."""
        tape = self.tapes[gpu.rank] = Tape(self, gpu, steps, held)
        try:
            done = tape.run()
        except BaseException:
            del self.tapes[gpu.rank]
            raise
        if done:
            del self.tapes[gpu.rank]
        else:
            gpu.greenlet.parent.switch()  # back when the tape has ended (_resume_tape)

    def _resume_tape(self, gpu: VirtualGPU, tape: Tape) -> None:
        """Where the program would be switched to while its tape runs: the tape goes on, and the
        program once the tape has ended."""
        gpu.suspended = False
        if tape.run():
            del self.tapes[gpu.rank]
            self._switch(gpu)

    def _maybe_resume(self, gpu: VirtualGPU) -> None:
        if not gpu.suspended:
            return
        if gpu.sync_op is not None:
            if not gpu.sync_op.done:
                return
            gpu.sync_op = None
        elif gpu.outstanding > self.max_ahead // 2:
            return
        if self.chain_blocks and gpu._mv[R_ADONE]:
            self.ops_core.settle(gpu)  # (the program reads the compute stream)
        if self.tapes:
            tape = self.tapes.get(gpu.rank)
            if tape is not None:
                self._resume_tape(gpu, tape)
                return
        self._switch(gpu)

    def group(self, ranks: tuple[int, ...]) -> Group:
        g = self.groups.get(ranks)
        if g is None:
            tier = max(self.topo.tier_of(ranks[0], r) for r in ranks)
            g = self.groups[ranks] = Group(ranks, tier, one_node=tier == 0 and self._even_ports(ranks, tier))
            g.cross = tuple(sorted({self.rank_shard[r] for r in ranks} - {self.index}))
            # with folding, only representatives issue calls: a group of one representative
            # and its tensor peers completes when the representative arrives
            g.arrivals = sum(1 for r in ranks if is_representative(r, self.fold))
        return g

    def _even_ports(self, ranks: tuple[int, ...], tier: int) -> bool:
        """Whether the scale-up ports of a one-node group share one bandwidth. The closed form of
        the intra-node fast path paces the group by its slowest port and charges every port alike:
        exact for even ports only, so a group with a degraded port takes the message-level path."""
        topo = self.topo
        if tier != 0 or not (topo.link_factor or topo.link_windows):
            return True
        bw, windows = topo.link_bw, topo.link_windows
        first = bw[topo.su_tx[ranks[0]]]
        return all(
            bw[topo.su_tx[r]] == first and bw[topo.su_rx[r]] == first
            and topo.su_tx[r] not in windows and topo.su_rx[r] not in windows
            for r in ranks
        )  # fmt: skip

    def world_group(self) -> Group:
        if self._world is None:
            self._world = self.group(tuple(range(self.topo.world_size)))
        return self._world

    def default_algorithm(self, op: str, group: Group) -> str:
        topo = self.topo
        if group.tier == 0:
            tier_algos = topo.groups[topo.node_group[topo.rank_node[group.ranks[0]]]].scale_up.algorithms
        else:
            tier_algos = topo.cluster.tiers[group.tier - 1].algorithms
        return tier_algos.get(op) or DEFAULTS[op]

    def in_closed_form(self, call, algorithm, group: Group | None = None) -> bool:
        """Whether ``call`` takes the intra-node fast path (``engine.fast_collectives`` on, an
        analytic algorithm, a group inside one node: looked up last, its ranks may be thousands)."""
        if not (self.fast_collectives and (algorithm.name, call.op) in ANALYTIC):
            return False
        return (group or self.groups[call.ranks]).one_node

    def closed_form(self, call, algorithm, group: Group | None = None) -> tuple[int, int] | None:
        """``(duration_ns, members that arrive)`` when ``call`` runs in closed form (the intra-node
        fast path of emulator/engine/collective_run.py), else None."""
        if not self.in_closed_form(call, algorithm, group):
            return None
        plan = self._closed_plan(call, algorithm)
        return plan[6], plan[2]

    def compute_time_ns(self, gpu: VirtualGPU, flops: float, bytes_: float, kind: str, precision: str) -> int:
        return op_duration_ns(gpu.spec, flops, bytes_, kind, precision)

    # -- launching -----------------------------------------------------------------------------
    def launch(self, gpu: VirtualGPU, op: Op, stream_name: str, comm: bool = False, after_all: bool = False) -> None:
        """Queue ``op`` on a stream with its dependencies (see emulator/engine/ops.py); hot path."""
        streams = gpu.streams
        stream = streams.get(stream_name)
        if stream is None:
            stream = gpu.stream(stream_name)
        last = stream.last
        if last is not None and last.kind == KSENDS and not last.done:
            self.ops_core.seal(gpu, stream)  # the kernels hold sends of this stream (OpCore.launch_send)
        op.stream = stream
        op.gpu = gpu
        deps = gpu.pending_waits.pop(stream_name, None) if gpu.pending_waits else None
        if after_all:
            if self.kernel_sends:
                for s in streams.values():
                    last = s.last
                    if last is not None and last.kind == KSENDS and not last.done:
                        self.ops_core.seal(gpu, s)
            deps = deps or []
            deps.extend(s.last for s in streams.values() if s is not stream and s.last is not None)
        elif comm and stream_name != "compute":
            compute = streams.get("compute")
            if compute is not None and compute.last is not None:
                deps = deps or []
                deps.append(compute.last)
        left = 0
        # the least compute time between a message arriving and this op starting (lookahead.py)
        last = stream.last
        delay = last.dl if last is not None and not last.done else INF
        if deps:
            for dep in deps:
                if not dep.done:
                    left += 1
                    if dep.dl < delay:
                        delay = dep.dl
                    if dep.dependents is None:
                        dep.dependents = [op]
                    else:
                        dep.dependents.append(op)
        op.deps_left = left
        kind = op.kind
        if kind == COMPUTE or kind == BLOCK:  # a block's proxy: ``a`` is its least duration
            faults = self.compute_faults
            # (a proxy's durations are already as launched: opcore.OpCore._template)
            if faults is not None and kind == COMPUTE and gpu.rank in faults.ranks:
                op.c = op.a  # the nominal duration, for the time a fault cost (``compute_lost_ns``)
                op.a = faults.launch_ns(gpu.rank, op.a)
            stream.launched_ns += op.a
            op.dl = delay + op.a
            if kind == BLOCK and op.d < op.dl:  # an arrival through a collective of several arrivals
                op.dl = op.d  # (lookahead.block_bound)
        elif kind == COLL:
            # message-level: it can complete as soon as a message arrives; closed form (intra-node):
            # it lasts its duration after the last member's start (this one's, when it stands alone)
            closed = op.dl
            op.dl = 0 if closed is None else (delay if closed[1] == 1 else 0) + closed[0]
        else:  # a receive can complete as soon as its message arrives
            op.dl = 0 if kind == RECV else delay
        op.cum = stream.launched_ns
        if comm and (op.cross or (kind == SEND and self.rank_shard[op.a] != self.index)):
            # it can reach another shard: the lookahead bounds when (emulator/engine/lookahead.py)
            if kind == SEND:
                op.cross = (self.rank_shard[op.a],)
            op.ds = delay
            compute = streams.get("compute")
            last = compute.last if compute is not None else None
            op.cdep = last if last is not None and not last.done else None
            gpu.cross_queued.append(op)
        stream.ops.append(op)
        stream.last = op
        # (CompiledGPU keeps the count in the kernels' arrays: read and written once each here)
        outstanding = gpu.outstanding = gpu.outstanding + 1
        if len(stream.ops) == 1:
            self._try_start(gpu, stream)
            outstanding = gpu.outstanding  # (an op that completed at once counted down)
        if outstanding >= self.max_ahead and not gpu.suspended:
            self._suspend(gpu)

    def launch_p2p(self, gpu: VirtualGPU, op: Op, stream_name: str) -> None:
        """Launch a send or receive ``op`` on ``stream_name`` (not ``compute``) as the GPU API does."""
        self.launch(gpu, op, stream_name, True)

    def launch_block(self, gpu: VirtualGPU, op: Op, after: Op | None) -> None:
        """Launch a block's proxy ``op`` on ``compute`` after ``after.wait()`` (None: nothing to wait for)."""
        if after is not None:
            after.wait()
        self.launch(gpu, op, "compute")

    def _try_start(self, gpu: VirtualGPU, stream) -> None:
        ops = stream.ops
        while ops:
            op = ops[0]
            if op.started:
                return
            t = self.now
            if op.deps_left:
                if stream.blocked_since < 0:
                    stream.blocked_since = t
                return
            since = stream.blocked_since
            if since >= 0:
                # (no setdefault: it would build an empty dict every time; the pipeline streams'
                # ops mostly start blocked)
                wait_ns = gpu.wait_ns
                waits = wait_ns.get(stream.name)
                if waits is None:
                    waits = wait_ns[stream.name] = {}
                by = stream.unblocked_by
                waits[by] = waits.get(by, 0) + t - since
                stream.blocked_since = -1
            op.started = True
            op.t_start = t
            kind = op.kind
            if kind == COMPUTE:
                duration = op.a
                if op.c is not None and self.compute_faults.windows:
                    # a slowdown window holding this start lengthens the kernel; the lookahead keeps
                    # the launch-time ``op.a``, shorter, hence still a lower bound
                    factor = self.compute_faults.window_factor(gpu.rank, t)
                    if factor != 1.0:
                        duration = round(duration / factor)
                seq = gpu.seq = gpu.seq + 1  # _push, inline: half of all events are compute completions
                heapq.heappush(self.heap, (t + duration, EV_OP_DONE, gpu.rank, gpu.rank, seq, op))
                return
            # (the kinds in the order of their frequency where the per-op engine runs: a tape's
            # block proxy, its receive, its send)
            if kind == BLOCK:  # a compiled block's proxy: its first op starts (opcore.py)
                self.ops_core.start_block(gpu, op, t)
                return
            if kind == RECV:
                if self._start_recv(gpu, op, t):
                    return
                continue  # completed at once: go on with the stream
            if kind == SEND:
                self._start_send(gpu, op, t)
                return
            if kind == COLL:
                if op.cross:
                    self.cross_runs[gpu.rank] = self.cross_runs.get(gpu.rank, 0) + 1
                self._start_collective(gpu, op, t)
                return
            self._instant(gpu, op, t)
            self._complete(gpu, op, t, start_next=False)

    def _instant(self, gpu: VirtualGPU, op: Op, t: int) -> None:
        kind = op.kind
        if kind == ALLOC:
            block = op.a
            gpu.mem_used += block.size_bytes
            gpu.allocations.add(block)
            if gpu.mem_used > gpu.capacity_bytes:
                if self.chain_blocks:
                    self.ops_core.settle(gpu)  # (the message lists the live allocations)
                raise OutOfMemoryError(oom_message(gpu, block, t))
            if gpu.mem_used > gpu.mem_peak:
                gpu.mem_peak = gpu.mem_used
        elif kind == FREE:
            gpu.mem_used -= op.a.size_bytes
            gpu.allocations.discard(op.a)
        elif kind == MARK:
            gpu.marks.append(t)
        else:
            assert kind == SYNC, kind

    def _complete(self, gpu: VirtualGPU, op: Op, t: int, start_next: bool = True) -> None:
        op.done = True
        op.t_end = t
        stream = op.stream
        stream.ops.popleft()
        gpu.outstanding -= 1
        gpu.ops_done += 1
        if t > gpu.last_time:
            gpu.last_time = t
        if op.kind == COMPUTE:
            gpu.compute_ns += t - op.t_start
            if op.c is not None:
                self.compute_lost_ns[gpu.rank] = self.compute_lost_ns.get(gpu.rank, 0) + t - op.t_start - op.c
            gpu.flops_done += op.b
            stream.done_ns += op.a
        elif op.kind in COMM_KINDS:
            gpu.comm_ns += t - op.t_start
            if op.cross and op.kind == COLL:
                left = self.cross_runs.pop(gpu.rank) - 1
                if left:
                    self.cross_runs[gpu.rank] = left
        elif op.kind == BLOCK:  # a compiled block that ended with an alloc or free (opcore.py)
            stream.done_ns += op.a
        if gpu.trace is not None:
            gpu.trace.append((stream.name, op.describe(), op.kind, op.t_start, t))
        dependents = op.dependents
        if dependents is not None:
            op.dependents = None
            for dep in dependents:
                dep.deps_left -= 1
                if dep.deps_left == 0:
                    s = dep.stream
                    s.unblocked_by = stream.name
                    if s.ops and s.ops[0] is dep:
                        self._try_start(gpu, s)
        if start_next and stream.ops:
            self._try_start(gpu, stream)
        # a suspended program mostly waits for its queue to drain to half: that test inline, one
        # call less per event (_maybe_resume decides the rest)
        if gpu.suspended and (gpu.sync_op is not None or gpu.outstanding <= self.max_ahead >> 1):
            self._maybe_resume(gpu)

    def _push(self, t: int, kind: int, gpu: VirtualGPU, obj) -> None:
        seq = gpu.seq = gpu.seq + 1
        heapq.heappush(self.heap, (t, kind, gpu.rank, gpu.rank, seq, obj))

    # -- the loop ------------------------------------------------------------------------------
    def next_time(self) -> float:
        t = self.heap[0][0] if self.heap else INF
        if self.core.top < t:
            t = self.core.top
        if self.ops_core is not None and self.ops_core.top < t:
            t = self.ops_core.top
        return t

    def next_time_of(self, ranks: dict) -> float:
        """The earliest pending event of any of ``ranks`` (steps, hand-overs, completions)."""
        t = min((e[0] for e in self.heap if e[2] in ranks), default=INF)
        core_t = self.core.next_time_of(ranks)
        if self.ops_core is not None:
            core_t = min(core_t, self.ops_core.next_time_of(ranks))
        return core_t if core_t < t else t

    def run_until(self, horizon: float) -> dict[int, list]:
        """Process every event stamped before ``horizon``; return the cross-shard messages."""
        if self.ops_core is not None:
            return self._run_until_compiled(horizon)
        heap = self.heap
        pop = heapq.heappop
        gpus = self.gpus
        count = 0
        core = self.core
        core_events = core.events
        # event times are integers: t < horizon exactly when t < ceil(horizon)
        core_horizon = NO_LIMIT if horizon >= NO_LIMIT else math.ceil(horizon)
        fail_from = self.fail_from_ns  # INF without failures: one comparison per event
        try:
            while True:
                # the core's next event goes first when its key precedes the Python heap's top
                ct = core.top
                if ct < horizon:
                    if not heap or ct < heap[0][0] or (ct == heap[0][0] and core.top_key() < heap[0][:5]):
                        self._run_core(heap[0] if heap else None, core_horizon)
                        continue
                if not heap or heap[0][0] >= horizon:
                    break
                t, kind, rank, _, _, obj = pop(heap)
                self.now = t
                count += 1
                if t >= fail_from and self._failed(rank, t):
                    continue  # a failed GPU processes nothing more (emulator/engine/faults.py)
                if kind == EV_OP_DONE:
                    self._complete(gpus[rank], obj, t)
                elif kind == EV_STEP:
                    self._step(gpus[rank], obj, t)
                else:
                    self._handover(obj, t)
        except EmulatorError as exc:
            if getattr(exc, "event_key", None) is None:  # raised by the event popped last (_run_core and
                at_event(exc, (t, kind, rank))  # the kernels' stops mark the errors their events raise)
            raise
        self.events += count + core.events - core_events
        if horizon > self.done_until:
            self.done_until = horizon
        return self._take_outbox()

    def _failed(self, rank: int, t: int) -> bool:
        """Whether ``rank`` (an event's GPU: the receiver of a hand-over) is down at ``t``."""
        at = self.failures.rank_ns.get(rank)
        return at is not None and at <= t

    def _take_outbox(self) -> dict[int, list]:
        self.core.take_outbox(self.outbox)
        out, self.outbox = self.outbox, {}
        return out

    def _run_core(self, limit, horizon: int) -> None:
        """Let the core run its events before ``limit``; complete what it finished."""
        status = self.core.run(limit, horizon)
        if status >= RECV_DONE:  # a point-to-point receive (p2p.py)
            self._core_receive(status)
        elif status:
            self._core_stopped(status)

    def _core_stopped(self, status: int) -> None:
        """Act where the core stopped for something else than a receive."""
        core = self.core
        if status == COMPLETE:
            gpu, op, t = core.finished()
            self.now = t
            try:
                self._complete(gpu, op, t)
            except EmulatorError as exc:  # a collective completes at its last channel's step (netkernels._step)
                at_event(exc, (t, EV_STEP, gpu.rank))
                raise
            core.reset_if_idle()
        elif status == MISMATCH:
            try:
                self._core_mismatch()
            except EmulatorError as exc:
                # met at a handover to that rank or at one of its channel's steps (netkernels._mismatch):
                # the kernels keep no event kind, so ties in time with another shard's error at a
                # step of a lower rank are ordered as if it were a handover (kind 0)
                at_event(exc, (int(core.st[RET_T]), EV_HANDOVER, int(core.st[RET_RANK])))
                raise
        else:
            assert status == GROW, status

    def _core_completed(self) -> None:
        gpu, op, t = self.core.finished()
        self.now = t
        self._complete(gpu, op, t)
        self.core.reset_if_idle()

    def live_stats(self, hot_links: int = 5, recent_iterations: int = 4, slow_ranks: int = 5) -> dict:
        """Progress figures for live monitoring (emulator/engine/live_figures.py)."""
        return live_stats(self, hot_links, recent_iterations, slow_ranks)

    def blocked(self) -> list[dict]:
        """What every unfinished rank is stuck on (for deadlock reports)."""
        self.stats.flush()  # the compiled engine's share of the ranks' latest times (opcore.CompiledGPU)
        # (and the proxies the kernels completed themselves settled: OpCore.settle, via its flush)
        if self.kernel_sends:
            self.ops_core.show_sends()  # the kernels' sends as the streams' ops
        return blocked_ranks(self)


def _describe_exception(exc: BaseException) -> str:
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        frame = tb.tb_frame
        if "emulator/engine" not in frame.f_code.co_filename:
            where = f" at {frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{where}"

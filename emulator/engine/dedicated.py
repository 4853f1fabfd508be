"""The dedicated rules of a shard that runs the compiled per-op engine (emulator/engine/opcore.py).

:class:`Shard` takes these variants of its hottest rules where its GPUs are CompiledGPUs
(``Shard.dedicated``, True unless a test compares with the generic rules): a send's or receive's
launch and a block proxy's launch with the rules of those op kinds only, an op's completion that
reads and writes the GPU's shared counters in the kernels' rows directly instead of through its
properties, and the event loop with the per-op engine's heap merged as a third one. They are the
generic rules of shard.py, line for line (test_opcore.py and test_tape.py compare both paths,
test_tape_dedicated.py with these off); a mixin so that shard.py keeps the generic ones.
"""

from __future__ import annotations

import heapq
import math

from emulator.engine.events import EV_OP_DONE, EV_STEP, INF, at_event
from emulator.engine.netkernels import NO_LIMIT, RECV_DONE
from emulator.engine.opkernels import (
    G_HEAPN,
    G_KRECV_T,
    R_AUTO,
    R_OUT,
    ST_BLOCK_DONE,
    ST_IRESUME,
    ST_RESUME,
    ST_SDRAIN,
)
from emulator.engine.opmessages import KSENDS
from emulator.engine.ops import BLOCK, COLL, COMPUTE, RECV, SEND, Op
from emulator.engine.vgpu import VirtualGPU
from emulator.errors import EmulatorError


class DedicatedRules:
    """The compiled per-op engine's variants of :class:`~emulator.engine.shard.Shard`'s rules (a mixin
    of Shard: they read its state and call its generic rules)."""

    def _launch_p2p_compiled(self, gpu: VirtualGPU, op: Op, stream_name: str) -> None:
        """:meth:`launch` of a send or receive (``comm``, not ``after_all``) on a stream other than
        ``compute``, on a CompiledGPU: its rules for those kinds only (a tape's receives and sends,
        tape.py)."""
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
        compute = streams.get("compute")
        if compute is not None:
            clast = compute.last
            if clast is not None:
                if deps is None:
                    deps = [clast]
                else:
                    deps.append(clast)
        else:
            clast = None
        left = 0
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
        op.dl = 0 if kind == RECV else delay
        op.cum = stream.launched_ns
        if op.cross or (kind == SEND and self.rank_shard[op.a] != self.index):
            if kind == SEND:
                op.cross = (self.rank_shard[op.a],)
            op.ds = delay
            op.cdep = clast if clast is not None and not clast.done else None
            gpu.cross_queued.append(op)
        self._enqueue(gpu, stream, op, left)

    def _launch_block_compiled(self, gpu: VirtualGPU, op: Op, after: Op | None) -> None:
        """:meth:`launch` of a block's proxy (opcore.OpCore.begin_step) on ``compute`` of a CompiledGPU,
        after ``after.wait()`` (a tape's receive not done yet, or None): its rules for a BLOCK."""
        streams = gpu.streams
        stream = streams.get("compute")
        if stream is None:
            stream = gpu.stream("compute")
        op.stream = stream
        op.gpu = gpu
        waits = gpu.pending_waits
        deps = waits.pop("compute", None) if waits else None
        if after is not None:  # (Op.wait: after the waits made before it)
            if deps is None:
                deps = [after]
            else:
                deps.append(after)
        left = 0
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
        if self.chain_blocks:
            # its proxy may start in the kernels where the block before it ends (opstreams._chain):
            # it waits for nothing of Python's, and the op before it is a running or queued block's
            # proxy that nothing of Python's waits for (nor can: the program holds no proxy, and
            # later ops wait for the stream's last), on a rank whose time no fault changes
            faults = self.compute_faults
            gpu._mv[R_AUTO] = 1 if (not left and last is not None and last.kind == BLOCK and not last.done
                                    and last.dependents is None
                                    and (faults is None or gpu.rank not in faults.ranks)) else 0  # fmt: skip
        # (a proxy's ``a`` is its least duration, already as launched: opcore.OpCore._template)
        launched = stream.launched_ns = stream.launched_ns + op.a
        dl = delay + op.a
        op.dl = op.d if op.d < dl else dl  # (lookahead.block_bound)
        op.cum = launched
        self._enqueue(gpu, stream, op, left)

    def _enqueue(self, gpu: VirtualGPU, stream, op: Op, left: int) -> None:
        """The end of both launches above (Shard.launch's): ``op`` (``left`` dependencies not done)
        queued on ``stream``, counted outstanding, started where it is the head and waits for
        nothing, and the program suspended at ``max_ops_ahead``."""
        ops = stream.ops
        ops.append(op)
        stream.last = op
        mv = gpu._mv
        outstanding = mv[R_OUT] + 1
        mv[R_OUT] = outstanding
        if len(ops) == 1:
            if left:  # _try_start's first test, inline: it would only note the wait
                if stream.blocked_since < 0:
                    stream.blocked_since = self.now
            else:
                self._try_start(gpu, stream)
                outstanding = mv[R_OUT]
        if outstanding >= self.max_ahead and not gpu._susp:
            self._suspend(gpu)

    def _queue_chained(self, gpu: VirtualGPU, proxies: list) -> None:
        """:meth:`_launch_block_compiled`'s rules for proxies whose launches the kernels made
        (OpCore.launch_steps: R_AUTO 1, one more outstanding op each, no suspension), in order,
        behind the running or queued block's proxy that is the compute stream's last: each waits for
        nothing, and the stream's head does not change."""
        stream = gpu.streams["compute"]
        append = stream.ops.append
        launched = stream.launched_ns
        delay = stream.last.dl
        for op in proxies:
            op.stream = stream
            op.gpu = gpu
            a = op.a
            launched += a
            delay += a
            if op.d < delay:
                delay = op.d  # (lookahead.block_bound)
            op.dl = delay
            op.cum = launched
            append(op)
        stream.launched_ns = launched
        stream.last = op

    def _complete_compiled(self, gpu: VirtualGPU, op: Op, t: int, start_next: bool = True) -> None:
        """:meth:`_complete` for a CompiledGPU, line for line: ``outstanding`` and ``flops_done`` in
        the kernels' arrays, ``suspended`` and ``sync_op`` as CompiledGPU's own fields (what its
        properties read), without a property call each; every op of a shard that runs the compiled
        per-op engine completes here (a tape's receives, sends and block proxies most of all)."""
        op.done = True
        op.t_end = t
        stream = op.stream
        stream.ops.popleft()
        mv = gpu._mv
        mv[R_OUT] -= 1
        gpu.ops_done += 1
        if t > gpu.last_time:
            gpu.last_time = t
        kind = op.kind
        if kind == RECV or kind == SEND or kind == COLL:
            gpu.comm_ns += t - op.t_start
            if op.cross and kind == COLL:
                left = self.cross_runs.pop(gpu.rank) - 1
                if left:
                    self.cross_runs[gpu.rank] = left
        elif kind == COMPUTE:
            gpu.compute_ns += t - op.t_start
            if op.c is not None:
                self.compute_lost_ns[gpu.rank] = self.compute_lost_ns.get(gpu.rank, 0) + t - op.t_start - op.c
            gpu._fmv[gpu._ri] += op.b  # (flops_done)
            stream.done_ns += op.a
        elif kind == BLOCK:  # a compiled block that ended with an alloc or free (opcore.py)
            stream.done_ns += op.a
        if gpu.trace is not None:
            gpu.trace.append((stream.name, op.describe(), kind, op.t_start, t))
        dependents = op.dependents
        if dependents is not None:
            op.dependents = None
            for dep in dependents:
                left = dep.deps_left - 1
                dep.deps_left = left
                if left == 0:
                    s = dep.stream
                    s.unblocked_by = stream.name
                    if s.ops and s.ops[0] is dep:
                        self._try_start(gpu, s)
        if start_next:
            ops = stream.ops
            if ops:
                head = ops[0]
                if head.deps_left:  # _try_start's first test, inline: it would only note the wait
                    if stream.blocked_since < 0:
                        stream.blocked_since = self.now
                else:
                    self._try_start(gpu, stream)
        if gpu._susp and (gpu._sync is not None or mv[R_OUT] <= self.max_ahead >> 1):
            self._maybe_resume(gpu)

    def _run_until_compiled(self, horizon: float) -> dict[int, list]:
        """:meth:`run_until` with the compiled per-op engine's heap as a third one, merged by key
        (its shard has no failures: emulator/engine/opcore.py)."""
        heap = self.heap
        pop = heapq.heappop
        gpus = self.gpus
        count = 0
        core, ops = self.core, self.ops_core
        core_events, ops_events = core.events, ops.events
        core_horizon = NO_LIMIT if horizon >= NO_LIMIT else math.ceil(horizon)
        # a tape's receive that a hand-over completes completes in the message core's run, which goes
        # on where Python has nothing to do after it (opkernels.run_net; EMULATOR_TAPE=steps and
        # blocks: ``kernel`` keeps a kernel call from Python per receive, the path tests compare with)
        receives = self.kernel_receives and self.fused_steps
        gm = ops.gm
        try:
            while True:
                ot, ct = ops.top, core.top
                if heap:
                    top = heap[0]
                    ht = top[0]
                else:
                    top = None
                    ht = INF
                # (a heap's whole key is built and compared only where the times tie)
                if ot < horizon and ot <= ct and ot <= ht:
                    # the least key of the other two heaps: the kernels stop before it
                    limit = top[:5] if top is not None else None
                    if ct < INF and (limit is None or ct <= ht):
                        ck = core.top_key()
                        if limit is None or ck < limit:
                            limit = ck
                    if limit is None or ot < limit[0] or ops.top_key() < limit:
                        # a block's end, handled here (a frame less: its most frequent stop), else _ops_stopped
                        status = ops.run(limit, core_horizon)
                        if status == ST_BLOCK_DONE:
                            gpu, proxy, t = ops.block_done()
                            self.now = t
                            try:
                                self._complete(gpu, proxy, t)
                            except EmulatorError as exc:
                                at_event(exc, (t, EV_OP_DONE, gpu.rank))
                                raise
                        elif status:
                            self._ops_stopped(status)
                        continue
                if ct < horizon:
                    if top is None or ct < ht or (ct == ht and core.top_key() < top[:5]):
                        limit = top[:5] if top is not None else None
                        if ot < INF and (limit is None or ot <= limit[0]):
                            okey = ops.top_key()
                            if limit is None or okey < limit:
                                limit = okey
                        # (_run_core, inline: a frame less for its most frequent stop, a receive)
                        if receives:
                            status = core.run(limit, core_horizon, ops.args)
                            if gm[G_KRECV_T] >= 0:  # receives completed in the call: as after complete_recv
                                self.now = gm[G_KRECV_T]
                                ops.top = ops.top_row[0] if gm[G_HEAPN] else INF
                        else:
                            status = core.run(limit, core_horizon)
                        if status >= RECV_DONE:
                            self._core_receive(status)
                        elif status:
                            self._core_stopped(status)
                        continue
                if not heap or ht >= horizon:
                    break
                t, kind, rank, _, _, obj = pop(heap)
                self.now = t
                count += 1
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
        self.events += count + core.events - core_events + ops.events - ops_events
        if horizon > self.done_until:
            self.done_until = horizon
        return self._take_outbox()

    def _ops_stopped(self, status: int) -> None:
        """Act where the compiled per-op engine stopped (:meth:`_run_until_compiled`'s call) for something
        else than a block's end."""
        ops = self.ops_core
        try:
            if status == ST_RESUME:
                gpu, t = ops.resumed()
                self.now = t
                self._maybe_resume(gpu)
            elif status == ST_SDRAIN:  # a sealed kernel send stream's last send completed (OpCore.send_drained)
                gpu, t = ops.resumed()
                ops.send_drained()
            elif status >= ST_IRESUME:  # an alloc or free of a block stopped them (opcore.OpCore.stopped)
                gpu, t = ops.resumed()
                ops.stopped(status, gpu, t)
        except EmulatorError as exc:
            # the kernels stopped at a compute completion of that rank (OpCore.top_key: EV_OP_DONE)
            at_event(exc, (t, EV_OP_DONE, gpu.rank))
            raise

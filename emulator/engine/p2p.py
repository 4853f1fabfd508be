"""Point-to-point messages of a shard: a message put on the sender's up-links, handed over to its
receiver after the route's latency (in this shard's heap, or through another shard's inbound
batch), and matched there with a pipeline receive or a collective's channel waiting for it.
:class:`PointToPoint` is part of :class:`~emulator.engine.shard.Shard` (as collective_run's
CollectiveExecution is), kept apart so that the event loop reads on its own.

The compiled message core (netcore.py) takes collective messages where it applies
(``Shard.compiled``) and, in shards that run the compiled per-op engine too (whose rank rows hold
the ranks' event counters, which a receive's completion key takes), the point-to-point ones:
a send's injection is one kernel call (NetCore.send), its hand-over an event of the core's heap
with the key this module would give it, and the match with a waiting receive or the mailbox
happens there; a receive that completes comes back as RECV_DONE with the key ``_push`` would have
given it then (Shard._run_core -> :meth:`PointToPoint._core_receive`), but a tape's kernel receive
with EMULATOR_TAPE=steps or blocks, completed inside the core's run (opkernels.run_net; NET_KRECV
where Python acts after it). The rules below are the specification; tests/emulator/test_netcore.py
holds the two paths equal."""

from __future__ import annotations

import heapq

from emulator.engine.collective_run import Chan
from emulator.engine.events import EV_HANDOVER, EV_OP_DONE, EV_STEP, at_event
from emulator.engine.netkernels import RECV_DONE, RET_PEER, RET_RANK, RET_RUN, RET_SIG_LO, RET_T
from emulator.engine.netlayout import RECV_MISMATCH
from emulator.engine.opkernels import NET_KRECV, R_SEQ
from emulator.engine.ops import Op
from emulator.engine.vgpu import VirtualGPU
from emulator.errors import EmulatorError, ProgramError


class PointToPoint:
    """The message methods of Shard (its links, topology, heap, outbox and GPUs)."""

    p2p_core = False  # whether the compiled message core takes point-to-point messages

    def _compile_messages(self) -> None:
        """Point-to-point messages through the compiled core (see the module docstring), where it
        applies: before any program runs."""
        if self.compiled and self.ops_core is not None:
            from emulator.engine.opkernels import R_SEQ

            self.core.attach_events(self.ops_core.rs, self.ops_core.rank_index, R_SEQ)
            self.p2p_core = True

    def _inject(self, gpu: VirtualGPU, dst: int, size: int, key_head: tuple, sig: int, t: int, kind: str) -> int | None:
        """Put a message on the sender's up-links at ``t``; returns when its tail has left, or None
        when a link of its route is down (the message is lost: its sender never sees it leave)."""
        src = gpu.rank
        route = self.topo.route(src, dst)
        sent = self.links.send(route, size, t)
        if sent is None:
            return None
        start, end_up = sent
        mseq = self.mseq
        seq = mseq[src] + 1
        mseq[src] = seq
        # a representative's message stands for ``fold`` identical ones on the other rails
        self.stats.messages(route.tier, size, kind, start, self.fold, end_up)
        record = (start + route.latency_ns, dst, src, seq, size, end_up, *key_head, sig)
        shard = self.rank_shard[dst]
        if shard == self.index:
            heapq.heappush(self.heap, (record[0], EV_HANDOVER, dst, src, seq, record))
        else:
            self.outbox.setdefault(shard, []).append(record)
        return end_up

    def deliver(self, records) -> None:
        """Accept cross-shard messages (all stamped at or after the current horizon)."""
        push = heapq.heappush
        collective = []
        for rec in records:
            rec = tuple(rec)
            # the round protocol's promise: nothing arrives stamped before what was already processed
            assert rec[0] >= self.done_until, (rec[0], self.done_until, self.index)
            # a collective's message (group id != 0), or any with p2p_core: the core's
            if self.p2p_core or (rec[6] and self.compiled):
                collective.append(rec)
            else:
                push(self.heap, (rec[0], EV_HANDOVER, rec[1], rec[2], rec[3], rec))
        if collective:
            self.core.deliver(collective)

    def _handover(self, rec: tuple, t: int) -> None:
        _, dst, src, _, size, end_up, gid, seq, chan, k, sig = rec
        delivery = self.links.receive(self.topo.route(src, dst), size, t, end_up)
        if delivery is None:
            return  # a link of its route went down before it was delivered: lost
        gpu = self.gpus[dst]
        key = (gid, seq, chan, src, k)
        waiter = gpu.waiters.pop(key, None)
        if waiter is None:
            gpu.mailbox[key] = (delivery, size, sig)
        elif type(waiter) is Chan:
            self._check_sig(gpu, waiter.run, src, sig, t)
            waiter.pending -= 1
            if delivery > waiter.t_end:
                waiter.t_end = delivery
            if waiter.pending == 0:
                self._push(waiter.t_end, EV_STEP, gpu, waiter)
        else:
            self._check_recv(gpu, waiter, src, size)
            self._push(max(delivery, waiter.t_start), EV_OP_DONE, gpu, waiter)

    def _start_send(self, gpu: VirtualGPU, op: Op, t: int) -> None:
        dst, size, tag = op.a, op.b, op.c
        key = (dst, tag)
        counts = gpu.p2p_send
        k = counts.get(key, 0)
        counts[key] = k + 1
        if self.p2p_core:
            end = self.core.send(gpu.rank, dst, size, tag, k, t)
            # (_push, inline: the core takes messages only beside the per-op engine, whose GPUs keep
            # their event counter in the kernels' row, and without failures: it always ends)
            mv = gpu._mv
            seq = mv[R_SEQ] + 1
            mv[R_SEQ] = seq
            rank = gpu.rank
            heapq.heappush(self.heap, (end, EV_OP_DONE, rank, rank, seq, op))
            return
        end = self._inject(gpu, dst, size, (0, tag, 0, k), size, t, "send")
        if end is not None:  # else lost to a failure: the send never ends
            self._push(end, EV_OP_DONE, gpu, op)

    def _start_recv(self, gpu: VirtualGPU, op: Op, t: int) -> bool:
        """Returns True if the receive waits (its completion is an event)."""
        src, _size, tag = op.a, op.b, op.c
        key = (src, tag)
        counts = gpu.p2p_recv
        k = counts.get(key, 0)
        counts[key] = k + 1
        if self.p2p_core:
            delivery = self.core.receive(gpu, op, src, tag, k, t)
            if delivery == -1:
                return True
            if delivery == -3:  # a message of another size: raises
                self._check_recv(gpu, op, src, int(self.core.st[RET_SIG_LO]))
        else:
            key = (0, tag, 0, src, k)
            msg = gpu.mailbox.pop(key, None)
            if msg is None:
                gpu.waiters[key] = op
                return True
            self._check_recv(gpu, op, src, msg[1])
            delivery = msg[0]
        if delivery > t:
            self._push(delivery, EV_OP_DONE, gpu, op)
            return True
        self._complete(gpu, op, t, start_next=False)
        return False

    def _core_receive(self, status: int) -> None:
        """The core stopped at a receive: completed (RECV_DONE; NET_KRECV: a tape's receive that the
        kernels completed in the core's run, opkernels.run_net, Python's part left), or met by a
        message of another size at its hand-over; errors carry the key of the event that the Python
        path raises at."""
        st = self.core.stv  # (Python ints)
        t = st[RET_T]
        run = st[RET_RUN]
        if run < -1:  # a tape's receive in the per-op engine's kernels (opcore.OpCore.launch_recv)
            ops = self.ops_core
            self.now = t
            try:
                if status == RECV_DONE or status == NET_KRECV:
                    # (its rank looked up only where Python goes on)
                    ops.complete_recv(-2 - run, t, status == NET_KRECV)
                    return
                gpu, op = ops.recv_op(-2 - run)  # (its Python op, with its name, only for the error)
                self._check_recv(gpu, op, st[RET_PEER], st[RET_SIG_LO])
                raise AssertionError("a receive's mismatch without one")
            except EmulatorError as exc:
                rank = ops.recv_gpu(-2 - run).rank
                at_event(exc, (t, EV_HANDOVER if status == RECV_MISMATCH else EV_OP_DONE, rank))
                raise
        gpu, op = self.core.recvs.pop(run)
        assert gpu.rank == st[RET_RANK]
        self.now = t
        try:
            if status == RECV_DONE:
                self._complete(gpu, op, t)
            else:
                self._check_recv(gpu, op, int(st[RET_PEER]), int(st[RET_SIG_LO]))
                raise AssertionError("a receive's mismatch without one")
        except EmulatorError as exc:
            at_event(exc, (t, EV_OP_DONE if status == RECV_DONE else EV_HANDOVER, gpu.rank))
            raise

    def _check_recv(self, gpu: VirtualGPU, op: Op, src: int, size: int) -> None:
        if size != op.b:
            raise ProgramError(
                f"rank {gpu.rank}: {op.name} matched a send of {size} B from rank {src} "
                f"at t={self.now} ns (sizes must be equal)"
            )

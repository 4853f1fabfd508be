"""How a shard executes collectives: message-level channels of steps, or the intra-node fast path.

A collective op expands (netmodel/collectives) into channels of steps; each step's sends leave
at once and the step ends when its sends have left and its receives have arrived. Every message of
a call carries the call's signature, so members that disagree are reported as a collective
mismatch. Groups inside one node complete in closed form instead (netmodel/collectives/analytic),
when the last member arrives. :class:`CollectiveExecution` is part of
:class:`~emulator.engine.shard.Shard`; it is kept apart so that the event loop reads on its own.
"""

from __future__ import annotations

from emulator.engine.diagnose import describe_sig
from emulator.engine.events import EV_OP_DONE, EV_STEP
from emulator.engine.folding import is_representative
from emulator.engine.netkernels import COMPLETE, MISMATCH
from emulator.engine.ops import Op
from emulator.engine.vgpu import VirtualGPU
from emulator.errors import CollectiveMismatchError
from netmodel.collectives.analytic import closed_form


class CollRun:
    """A member's execution of one collective: its channels and message counters."""

    __slots__ = ("op", "gid", "seq", "sig", "left", "t_end", "scount", "rcount")

    def __init__(self, op: Op, left: int):
        self.op = op
        self.gid, self.seq = op.c
        self.sig = op.d
        self.left = left
        self.t_end = 0
        self.scount: dict = {}
        self.rcount: dict = {}


class Chan:
    """One channel of a collective in progress: its step iterator and outstanding receives."""

    __slots__ = ("run", "it", "pending", "t_end")

    def __init__(self, run: CollRun, it):
        self.run = run
        self.it = it
        self.pending = 0
        self.t_end = 0


class CollectiveExecution:
    """Collective execution for :class:`~emulator.engine.shard.Shard` (uses its links, heap and stats)."""

    def _start_collective(self, gpu: VirtualGPU, op: Op, t: int) -> None:
        plan = self.closed_plans.get(id(op.a))  # a call planned in closed form before: no checks again
        if plan is not None and plan[0] is op.a and plan[1] is op.b:
            self._rendezvous(gpu, op, t, plan)
            return
        if self.in_closed_form(op.a, op.b):
            self._rendezvous(gpu, op, t, self._closed_plan(op.a, op.b))
            return
        assert self.fold == 1 or all(is_representative(r, self.fold) for r in op.a.ranks), "folded: no tensor group"
        if self.compiled:
            status = self.core.start(gpu, op, t)
            if status < 0:  # no channels: nothing to send
                self.core.note_collective(op, t)
                self._push(t, EV_OP_DONE, gpu, op)
            elif status == COMPLETE:
                self._core_completed()
            elif status == MISMATCH:
                self._core_mismatch()
            return
        channels = op.b.channels(op.a, self.topo)
        run = CollRun(op, len(channels))
        if not channels:
            self.core.note_collective(op, t)
            self._push(t, EV_OP_DONE, gpu, op)
            return
        for it in channels:
            self._step(gpu, Chan(run, it), t)

    def _rendezvous(self, gpu: VirtualGPU, op: Op, t: int, plan: tuple) -> None:
        """Fast path for a group inside one node (hence one shard): see netmodel/collectives/analytic."""
        call = op.a
        _, _, arrivals, links, tx, rx, duration, messages, msg_bytes, per, busy, acc = plan
        if arrivals == 1:  # one member stands for the group (symmetry folding): nothing to wait for
            arrived = ((gpu, op),)
        else:
            key = op.c
            arrived = self.rendezvous.get(key)
            if arrived is None:
                arrived = self.rendezvous[key] = []
            if arrived and arrived[0][1].d != op.d:
                raise _mismatch(gpu, op, arrived[0][0].rank, arrived[0][1].d, t)
            arrived.append((gpu, op))
            if len(arrived) < arrivals:
                return
            del self.rendezvous[key]
        # every member's ports are held for the whole collective, from when the last is free
        held = self.links.hold(links, t, duration, call.n)
        if held is None:
            # a port of the group is down before the call ends (emulator/engine/faults.py): the whole
            # call is lost, its members never complete; keep them arrived for the hang report
            self.rendezvous[op.c] = list(arrived)
            return
        start, end = held
        core = self.core
        acc[0] += 1  # the plan's figures, added up by ShardStats.flush
        if start - t > acc[1]:
            acc[1] = start - t
        self.stats.timeline_add(0, msg_bytes, messages, start, end)
        for member, member_op in arrived:
            core.note_collective(member_op, end)  # its end is known now (live figures only)
            self._push(end, EV_OP_DONE, member, member_op)

    def _closed_plan(self, call, algorithm) -> tuple:
        """Everything about a one-node call that does not depend on time (programs repeat calls):
        ``(call, algorithm, arrivals, ports, tx ports, rx ports, duration, messages, bytes per
        message, messages per port, busy ns per port, accumulator)``, kept per call (the
        accumulator counts its calls for ShardStats.closed_account)."""
        plan = self.closed_plans.get(id(call))
        if plan is not None and plan[0] is call and plan[1] is algorithm:
            return plan
        ranks = call.ranks
        ports = self.group_ports.get(ranks)
        if ports is None:
            ports = self.group_ports[ranks] = self._ports(ranks)
        links, tx, rx, bw, latency = ports
        duration, messages, msg_bytes = closed_form(algorithm.name, call, bw, latency)
        if call.op in ("broadcast", "reduce") and call.n > 1:
            # a chain from the root (broadcast) or to it (reduce): the end that has no peer
            # neither sends nor receives on that side
            topo = self.topo
            at = call.root_index
            chain = ranks[at:] + ranks[:at]
            if call.op == "reduce":
                chain = chain[1:][::-1] + chain[:1]
            per = messages // (call.n - 1)
            tx = tuple(topo.su_tx[r] for r in chain[:-1])
            rx = tuple(topo.su_rx[r] for r in chain[1:])
        else:
            per = messages // call.n
        busy = per * int(-(-msg_bytes // bw))
        arrivals = self.groups[ranks].arrivals
        acc = self.stats.closed_account(tx, rx, per, msg_bytes, busy, messages, call.op)
        plan = (call, algorithm, arrivals, links, tx, rx, duration, messages, msg_bytes, per, busy, acc)
        self.closed_plans[id(call)] = plan
        return plan

    def _ports(self, ranks: tuple[int, ...]) -> tuple:
        """(all ports, tx ports, rx ports, slowest bandwidth, latency) of a one-node group."""
        topo = self.topo
        tx = tuple(topo.su_tx[r] for r in ranks)
        rx = tuple(topo.su_rx[r] for r in ranks)
        links = tx + rx
        return links, tx, rx, min(topo.link_bw[link] for link in links), topo.su_latency_ns[topo.rank_node[ranks[0]]]

    def _step(self, gpu: VirtualGPU, chan: Chan, t: int) -> None:
        run = chan.run
        step = next(chan.it, None)
        if step is None:
            run.left -= 1
            if t > run.t_end:
                run.t_end = t
            if run.left == 0:
                self.core.note_collective(run.op, run.t_end)
                self._complete(gpu, run.op, run.t_end)
            return
        sends, recvs = step
        t_end = t
        scount, rcount = run.scount, run.rcount
        pending = 0
        for peer, size, ch in sends:
            ck = (peer, ch)
            k = scount.get(ck, 0)
            scount[ck] = k + 1
            end = self._inject(gpu, peer, size, (run.gid, run.seq, ch, k), run.sig, t, run.op.a.op)
            if end is None:  # lost to a failure (emulator/engine/faults.py): the step never ends
                pending = 1
            elif end > t_end:
                t_end = end
        mailbox = gpu.mailbox
        for peer, _size, ch in recvs:
            ck = (peer, ch)
            k = rcount.get(ck, 0)
            rcount[ck] = k + 1
            key = (run.gid, run.seq, ch, peer, k)
            msg = mailbox.pop(key, None)
            if msg is None:
                gpu.waiters[key] = chan
                pending += 1
            else:
                self._check_sig(gpu, run, peer, msg[2], t)
                if msg[0] > t_end:
                    t_end = msg[0]
        chan.pending = pending
        chan.t_end = t_end
        if pending == 0:
            self._push(t_end, EV_STEP, gpu, chan)

    def _core_mismatch(self) -> None:
        gpu, op, peer, sig, t = self.core.mismatch()
        raise _mismatch(gpu, op, peer, sig, t)

    def collective_waits(self, gpu: VirtualGPU, op: Op) -> list[int]:
        """Peers whose messages ``op`` (a started message-level collective) still waits for."""
        if self.compiled:
            return self.core.waiting_peers(gpu.rank, op)
        return sorted({key[3] for key, w in gpu.waiters.items() if type(w) is Chan and w.run.op is op})

    def _check_sig(self, gpu: VirtualGPU, run: CollRun, peer: int, sig: int, t: int) -> None:
        if sig != run.sig:
            raise _mismatch(gpu, run.op, peer, sig, t)


def _mismatch(gpu: VirtualGPU, op: Op, peer: int, peer_sig: int, t: int) -> CollectiveMismatchError:
    """The report when a peer's call #k on the same group is not this rank's call #k."""
    return CollectiveMismatchError(
        f"collective mismatch at t={t} ns: rank {gpu.rank} issued {op.describe()} but rank {peer} "
        f"issued {describe_sig(peer_sig)} as call #{op.c[1]} on the same group"
    )

"""A tape's pipeline messages as ops of the op kernels (OpCore's part for tape.py's kernel modes).

A tape's sends to ranks of its own shard, and on one shard its receives, are launched here into the
kernels' ring (``launch_send`` / ``launch_recv``): released there by a block's last op, put on the
links by the message core's rules, completed in the kernels' heap with the seq the Python rules
give them. While the kernels hold a stream's messages the shard's stream holds one stand-in op
(kind ``KSENDS``); a Python launch on it, or a wait for every stream, seals it (``seal``) and the ops
behind it go on when its last kernel message completes (``send_drained`` / ``drained``).
``show_sends`` lets a deadlock report name the kernels' head messages as the streams' ops.

A mixin of :class:`emulator.engine.opcore.OpCore`: it reads the core's arrays and tables (``self.args``,
``self.sd``, ``self.kc``, ``slot_descs``, ``send_desc``, ``stand_ins``, ``shard``) set up there.
"""

from __future__ import annotations

import numpy as np

from emulator.engine import opkernels as k
from emulator.engine.events import INF
from emulator.engine.ops import BLOCK, RECV, SEND, Op
from emulator.engine.vgpu import VirtualGPU

# the op kind of a kernel send stream's stand-in on the shard's stream (OpCore.launch_send): not one
# of ops.py's kinds, never started, completed or counted by the Python rules
KSENDS = 100
# OpCore.launch_step's statuses (not the kernels'): the step's send launched with its block, and the
# next step's receive too
ST_SENT, ST_STEPPED = 100, 101

_G_ERR, _G_NOVF, _G_HEAPN, _G_STATUS, _G_RET_RI = k.G_ERR, k.G_NOVF, k.G_HEAPN, k.G_STATUS, k.G_RET_RI
_G_SENT, _G_LOW, _G_RDRAIN, _R_OUT = k.G_SENT, k.G_LOW, k.G_RDRAIN, k.R_OUT
_ST_LAUNCHED, _ST_SUSPEND, _ST_STEPPED, _ST_LIMIT = k.ST_LAUNCHED, k.ST_SUSPEND, k.ST_STEPPED, k.ST_LIMIT
_ST_RMISMATCH = k.ST_RMISMATCH


def _grown(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with at least ``rows`` rows (doubling, zeros below): the op core's tables grow so."""
    if rows <= a.shape[0]:
        return a
    b = np.zeros((max(rows, 2 * a.shape[0]),) + a.shape[1:], a.dtype)
    b[: a.shape[0]] = a
    return b


class KernelMessages:
    """OpCore's launches, completions and hand-backs of a tape's messages in the kernels."""

    def launch_send(self, gpu: VirtualGPU, message: tuple, name: str) -> bool:
        """Shard.launch of a tape's pipeline send (``message``: api.GPU.prepare_p2p's) on stream
        ``name`` in the kernels: False (nothing done) where the Python rules must take it - a send
        to another shard, the stream holds Python's ops, or a wait the program asked for, or the
        rank has no slot left.

        The shard's stream holds one stand-in op (kind KSENDS, started, never completed by the
        Python rules, not counted) while the kernels hold sends of it: a Python launch on that stream
        or one that waits for every stream seals it (:meth:`seal`), and the ops behind it go on when
        its last send completes (:meth:`send_drained`), as behind that send."""
        d, stream = self._send_slot(gpu, message, name)
        if d < 0:
            return False
        # (after the block just launched, or done)
        self._launch_message(gpu, stream, k.launch_send, d, message[3], gpu.streams["compute"].last)
        return True

    def launch_step(self, gpu: VirtualGPU, send: tuple | None, recv: tuple | None) -> int:
        """OpCore.launch_rest, then, where it launched the block to its end and the program runs on
        (ST_LAUNCHED: no instant op stopped it), the step's ``send`` (:meth:`launch_send`) and the
        next step's receive ``recv`` (:meth:`launch_recv`; None: none, or the Python rules take
        it), each ``(message, stream)``, in the same kernel call (opkernels.launch_step: tape.py's
        phases 2, 3 and the next step's 0). Nothing of Python's runs between these launches, so
        their checks, made first, see what they would see after the block; where one fails the
        call is launch_rest's alone. Returns ST_SUSPEND (as launch_rest), ST_LAUNCHED (the block
        only: the tape launches the rest), ST_SENT (the block and its send: the program must
        suspend before the receive, or there is none) or ST_STEPPED (all three)."""
        d = rd = -1
        stream = rstream = None
        if send is not None:
            d, stream = self._send_slot(gpu, send[0], send[1])
            if d < 0:  # (the Python rules launch the send, then the receive)
                return self.launch_rest(gpu)
        last = gpu.streams["compute"].last  # (the block being launched: its proxy, done only after a suspension)
        dep = 0 if last is None or last.done else 1
        # (a receive after a done block may complete at once, with what follows from it: not here)
        if recv is not None and dep and (stream is None or recv[1] != stream.name):
            rd, rstream = self._recv_slot(gpu, recv[0], recv[1], last)
        if d < 0 and rd < 0:
            return self.launch_rest(gpu)
        # (the counters only: no kernel message of these streams reads them before these)
        fresh = stream is not None and not stream.ops
        if fresh:
            self._stand_in_counts(gpu, stream)
        rfresh = rstream is not None and not rstream.ops
        if rfresh:
            self._stand_in_counts(gpu, rstream)
        shard = self.shard
        k.launch_step(*self.args, gpu._ri, shard.now, d, send[0][3] if d >= 0 else 0,
                      dep, rd, recv[0][3] if rd >= 0 else 0)  # fmt: skip
        return self._stepped(gpu, stream, rstream, fresh, rfresh)

    def _stepped(self, gpu: VirtualGPU, stream, rstream, fresh: bool, rfresh: bool) -> int:
        """:meth:`launch_step`'s checks after its kernel call (also after launch_steps' last step):
        its status (``stream`` / ``rstream``: the send's and receive's streams, ``fresh`` /
        ``rfresh`` where they take their stand-in now)."""
        shard = self.shard
        g = self.gm
        status = g[_G_STATUS]
        if status != _ST_LAUNCHED and status != _ST_STEPPED:  # launch_rest's checks after its call
            if g[_G_ERR] or g[_G_NOVF]:
                self._overflowed()
            self.top = self.top_row[0] if g[_G_HEAPN] else INF
            if status == _ST_SUSPEND:
                return status
            self.instant_stop(gpu, status, shard.now)
            if gpu.outstanding >= shard.max_ahead and not gpu.suspended:
                shard._suspend(gpu)
            return _ST_LAUNCHED
        # launch_rest's checks (none acts on ST_LAUNCHED but the error ones), launch_send's and
        # launch_recv's (Shard.launch's suspension after the send: the kernels did not receive then)
        if fresh:
            self._stand_in(gpu, stream)
        if rfresh and status == _ST_STEPPED:
            self._stand_in(gpu, rstream)
        # (_after, inline: a call per tape step; _net_after's Python may call the kernels again)
        if g[_G_ERR] or g[_G_NOVF]:
            self._overflowed()
        if g[_G_SENT] or g[_G_LOW] or g[_G_RDRAIN]:
            self._net_after()
        self.top = self.top_row[0] if g[_G_HEAPN] else INF
        if g[_G_STATUS] == _ST_RMISMATCH:
            self._mismatch()
        # (CompiledGPU's outstanding and suspended without their properties)
        if gpu._mv[_R_OUT] >= shard.max_ahead and not gpu._susp:
            shard._suspend(gpu)
        return ST_STEPPED if status == _ST_STEPPED else ST_SENT

    def launch_steps(self, gpu: VirtualGPU, steps: list, i: int, held: dict) -> tuple | None:
        """Steps ``i``, ``i + 1``, ... of a tape (tape.py's ``steps``, the program's ``held``) launched in
        one kernel call (opkernels.launch_steps; EMULATOR_TAPE=arrays) from step ``i``'s phase 1 with
        no receive of Python's to wait for: each as Tape.run's phases 1 and 2 launch it with
        :meth:`launch_step`, its block's proxy queued behind the one before (Shard._queue_chained).
        A step goes to the kernels where the per-step path would make the same calls with nothing of
        Python's between them: its proxy chained (R_AUTO 1: the first's conditions checked here), its
        send and the next step's receive on their streams' kernel slots with known descriptors, no
        stand-in to make; the kernels stop where the program would be suspended or Python must
        act. Then Python makes the proxies, their Allocations and the program's ``held`` entries,
        in the same order, with the same values. Returns None (nothing launched: the per-step path
        goes on), else ``(j, memory, status)``: steps ``i`` to ``j - 1`` launched, step ``j``'s proxy
        made (its allocations ``memory``) and ``status`` what launch_step returned for it."""
        shard = self.shard
        streams = gpu.streams
        last = streams["compute"].last
        faults = shard.compute_faults
        # Shard._launch_block_compiled's chain conditions (R_AUTO) for step i's proxy
        if (gpu.pending_waits or last is None or last.kind != BLOCK or last.done or last.dependents is not None
                or (faults is not None and gpu.rank in faults.ranks)):  # fmt: skip
            return None
        n = len(steps)
        rank = gpu.rank
        python_ranks = self.python_ranks
        # (the descriptors of the messages the per-step path launched before: _send_slot's and
        # _recv_slot's by the message's identity - held in the values, so an id is its message's)
        send_desc = self.send_desc
        sv = self.step_view  # (step_rows, flat: a Python int a write)
        rows = self.step_rows.shape[0]
        checked = None  # the (send, receive) streams found taking kernel messages (_kernel_stream)
        # the rank's outstanding ops as the kernels will count them: no more steps than they launch
        # before the program would be suspended (opkernels.launch_steps' stops)
        out, max_ahead, step_out = gpu._mv[_R_OUT], shard.max_ahead, self.step_out
        s = i
        m = 0
        while s + 1 < n and m < rows and out + 1 < max_ahead:
            _, known, _, _, _, send, _ = steps[s]
            recv = steps[s + 1][0]
            if send is None or recv is None:
                break
            b = known[1]
            if b < 0 or (known[2] and rank in python_ranks):
                break
            smsg, sname = send
            rmsg, rname = recv
            e = send_desc.get(id(smsg))
            r = send_desc.get(id(rmsg))
            if e is None or r is None or e[2] is not gpu or r[2] is not gpu or e[3] != sname or r[3] != rname:
                break
            names = (sname, rname)
            if names != checked:  # (nothing changes the streams before the call)
                if sname == rname or not (_takes(streams.get(sname)) and _takes(streams.get(rname))):
                    break
                checked = names
            o = 5 * m
            sv[o], sv[o + 1], sv[o + 2], sv[o + 3], sv[o + 4] = b, e[1], smsg[3], r[1], rmsg[3]
            m += 1
            s += 1
            added = step_out.get(b)
            if added is None:
                row0, count = self.tp[b]
                added = step_out[b] = 3 + int(np.count_nonzero(self.ti[row0 + 1 : row0 + count, 0] != k.I_W))
            out += added
            if out >= max_ahead:
                break
        if not m:
            return None
        c = k.launch_steps(*self.args, gpu._ri, shard.now, self.step_rows, m)
        if not c:
            return None
        # the launched steps' proxies (claim, OpCore._proxy, Shard._queue_chained) and ``held``
        claim, proxy_of = self.claim, self._proxy
        j = i + c - 1
        proxies = []
        for s in range(i, j + 1):
            _, known, alloc_key, alloc_name, free_key, _, suffix = steps[s]
            memory = [alloc_name, held.pop(free_key) if free_key is not None else None]
            if known[2]:  # (claim does nothing else for a block the kernels take, checked above)
                claim(gpu, known)
            self.suffix = suffix
            proxies.append(proxy_of(known, memory))
            if s < j and alloc_key is not None:
                held[alloc_key] = memory[0]
        shard._queue_chained(gpu, proxies)
        send = steps[j][5]
        return j, memory, self._stepped(gpu, streams[send[1]], streams[steps[j + 1][0][1]], False, False)

    def _send_slot(self, gpu: VirtualGPU, message: tuple, name: str) -> tuple:
        """launch_send's checks: ``(descriptor, stream)``, or ``(-1, None)`` where the Python rules
        must take the send."""
        stream = _kernel_stream(gpu, name)
        if stream is None:
            return -1, None
        if gpu.pending_waits and name in gpu.pending_waits:
            return -1, None
        # (the program prepares each message once: its descriptor by the tuple's identity, for the
        # rank and stream it was made for - a descriptor's slot is its stream's)
        known = self.send_desc.get(id(message))
        if known is not None and known[0] is message and known[2] is gpu and known[3] == name:
            return known[1], stream
        _, _, dst, _, tag = message
        if self.shard.rank_shard[dst] != self.shard.index:
            return -1, None  # (its Python op bounds this shard's output: lookahead.py)
        d = self._descriptor(gpu, name, dst, tag)
        if d < 0:
            return -1, None
        self.send_desc[id(message)] = (message, d, gpu, name)
        return d, stream

    def _stand_in_counts(self, gpu: VirtualGPU, stream) -> None:
        """The stream's messages go to the kernels: the counters from the rank's (:meth:`_stand_in` next)."""
        for e in self.slot_descs[(gpu.rank, stream.name)]:
            self.kc[self.sd.item(e, k.SD_CTR)] = self._counts(gpu, e).get(self._pair(e), 0)

    def _stand_in(self, gpu: VirtualGPU, stream) -> None:
        """The stream's stand-in op while the kernels hold its messages (after :meth:`_stand_in_counts`)."""
        key = (gpu.rank, stream.name)
        stand_in = self.stand_ins[key] = Op(KSENDS, stream.name, None, None, None, False)
        stand_in.started = True
        stand_in.dl = 0  # (the lookahead's least delay behind it: 0 is a lower bound of any, lookahead.py)
        stand_in.stream = stream
        stand_in.gpu = gpu
        stream.ops.append(stand_in)
        stream.last = stand_in

    def launch_recv(self, gpu: VirtualGPU, message: tuple, name: str) -> bool:
        """Shard.launch of a tape's pipeline receive on stream ``name`` in the kernels, and the wait
        of the block launched next for it (tape.py's phase 1, opkernels.R_RPEND): False (nothing
        done) where the Python rules must take it (:meth:`_recv_slot`). A ProgramError for a
        message of another size, as p2p.PointToPoint._start_recv."""
        compute = gpu.streams.get("compute")
        last = compute.last if compute is not None else None
        d, stream = self._recv_slot(gpu, message, name, last)
        if d < 0:
            return False
        self._launch_message(gpu, stream, k.launch_recv, d, message[3], last)
        return True

    def _launch_message(self, gpu: VirtualGPU, stream, launch, d: int, size: int, last) -> None:
        """launch_send's and launch_recv's launch in the kernels (``launch``: k.launch_send or
        k.launch_recv, descriptor ``d``, ``size`` bytes, after ``last``, the compute stream's last op,
        where it is not done): the stream's stand-in where it had no op, then Shard.launch's check."""
        if not stream.ops:
            self._stand_in_counts(gpu, stream)
            self._stand_in(gpu, stream)
        shard = self.shard
        launch(*self.args, gpu._ri, d, size, 0 if last is None or last.done else 1, shard.now)
        self._after()
        if gpu.outstanding >= shard.max_ahead and not gpu.suspended:
            shard._suspend(gpu)

    def _recv_slot(self, gpu: VirtualGPU, message: tuple, name: str, last) -> tuple:
        """launch_recv's checks (``last``: the compute stream's last op): ``(descriptor, stream)``,
        or ``(-1, None)`` where the Python rules must take the receive - as for a send
        (:meth:`_send_slot`), or the compute stream's last op is not a block (a dependency the
        kernels do not hold), or has Python ops depending on it (the kernels would start the
        receive before them), or the program asked for waits, or the run has several shards."""
        if gpu.pending_waits or self.shard.shards > 1:
            # (several shards: the lookahead's least delay of the block after it, Shard.launch's
            # ``dl``, counts the receive it waits for in Python: kept there)
            return -1, None
        if last is not None and not last.done and (last.kind != BLOCK or last.dependents is not None):
            return -1, None
        stream = _kernel_stream(gpu, name)
        if stream is None:
            return -1, None
        known = self.send_desc.get(id(message))
        if known is not None and known[0] is message and known[2] is gpu and known[3] == name:
            return known[1], stream
        _, _, src, _, tag = message
        d = self._descriptor(gpu, name, src, tag, True)
        if d < 0:
            return -1, None
        self.send_desc[id(message)] = (message, d, gpu, name)
        return d, stream

    def complete_recv(self, op: int, t: int, done: bool = False) -> None:
        """A kernel receive's hand-over completed it (p2p.PointToPoint._core_receive): Shard._complete.
        Its rank (the kernels' G_RET_RI, read before _after's Python may call the kernels again) is
        looked up only where Python goes on: most end in the kernels. ``done``: the kernels completed
        it already, in the message core's run (opkernels.run_net, NET_KRECV): Python's part only."""
        if not done:
            k.complete_recv(*self.args, op, t)
        ri = self.gm[_G_RET_RI]
        status = self._after()
        if status == _ST_LIMIT:
            return
        shard = self.shard
        gpu = shard.gpus[self.ranks[ri]]
        if status == k.ST_RESUME:
            shard._maybe_resume(gpu)
            return
        # an instant op of the block it released stopped the kernels: as OpCore.stopped
        self.instant_stop(gpu, status, t)
        if gpu.suspended and (gpu.sync_op is not None or gpu.outstanding <= shard.max_ahead >> 1):
            shard._maybe_resume(gpu)

    def recv_gpu(self, op: int) -> VirtualGPU:
        """A kernel receive's rank (:meth:`recv_op` without the op)."""
        return self.shard.gpus[self.ranks[self.ops.item(op, k.O_RI)]]

    def recv_op(self, op: int) -> tuple:
        """A kernel receive's rank and its Python op as the Python rules would have it (its name,
        peer, bytes and tag: errors and deadlock reports)."""
        src, tag = self._pair(self.ops.item(op, k.O_LOST))
        size = self.ops.item(op, k.O_VAL)
        gpu = self.shard.gpus[self.ranks[self.ops.item(op, k.O_RI)]]
        return gpu, Op(RECV, f"recv(src={src}, tag={tag}, {size} B)", src, size, tag)

    def _mismatch(self) -> None:
        """ST_RMISMATCH: the receive's error (p2p.PointToPoint._check_recv)."""
        g = self.gm
        gpu, op = self.recv_op(g[k.G_RET_OP])
        shard = self.shard
        shard.now = g[k.G_RET_T]
        shard._check_recv(gpu, op, op.a, g[k.G_RET_TSTART])
        raise AssertionError("a receive's mismatch without one")

    def _pair(self, e: int) -> tuple:
        return self.sd.item(e, k.SD_DST), self.sd.item(e, k.SD_TAG)

    def _counts(self, gpu: VirtualGPU, e: int) -> dict:
        """The rank's message counters of descriptor ``e``'s kind (p2p.PointToPoint's)."""
        return gpu.p2p_recv if self.sd.item(e, k.SD_RECV) else gpu.p2p_send

    def _descriptor(self, gpu: VirtualGPU, name: str, dst: int, tag: int, recv: bool = False) -> int:
        """The descriptor of a send (or ``recv``: a receive from ``dst``) of (rank, stream, peer,
        tag), new with its stream slot where needed, or -1 when the rank's slots are taken."""
        d = self.desc_of.get((gpu.rank, name, dst, tag))
        if d is not None:
            return d
        names = self.slot_names.setdefault(gpu._ri, [])
        if name not in names:
            if len(names) >= k.NSS:
                return -1
            names.append(name)
            base = k.R_SS0 + names.index(name) * k.SS_FIELDS
            self.rs[gpu._ri, base + k.SS_HEAD] = self.rs[gpu._ri, base + k.SS_TAIL] = -1
            self.rs[gpu._ri, base + k.SS_BLK] = -1
            self.slot_descs[(gpu.rank, name)] = []
        d = self.n_sd
        self.sd = _grown(self.sd, d + 1)
        self.kc = _grown(self.kc, d + 1)
        self.sd[d] = (dst, tag, 0 if recv else self.shard.core.rid(gpu.rank, dst), d, names.index(name), recv)
        # (the counter as the rank has it: any message of this pair so far ran in Python)
        self.kc[d] = self._counts(gpu, d).get((dst, tag), 0)
        self.n_sd = d + 1
        self.desc_of[(gpu.rank, name, dst, tag)] = d
        self.slot_descs[(gpu.rank, name)].append(d)
        self._pack_if_grown()
        return d

    def _slot_base(self, gpu: VirtualGPU, name: str) -> int:
        return k.R_SS0 + self.slot_names[gpu._ri].index(name) * k.SS_FIELDS

    def _hand_back(self, gpu: VirtualGPU, name: str) -> Op:
        """The stream's sends are Python's again: the rank's counters take the kernels'."""
        stand_in = self.stand_ins.pop((gpu.rank, name))
        for e in self.slot_descs[(gpu.rank, name)]:
            n = self.kc.item(self.sd.item(e, k.SD_CTR))
            pair = self._pair(e)
            counts = self._counts(gpu, e)
            if n != counts.get(pair, 0):
                counts[pair] = n
        self.rs[gpu._ri, self._slot_base(gpu, name) + k.SS_SEAL] = 0
        return stand_in

    def seal(self, gpu: VirtualGPU, stream) -> None:
        """Python is about to launch on ``stream``, or to wait for its last op, whose sends the
        kernels hold: when they are all done the stand-in goes (the stream is Python's again), else
        it stays the stream's head and last op until the last send completes (send_drained)."""
        stand_in = stream.last
        if stand_in.d:
            return  # sealed already
        if self.rs[gpu._ri, self._slot_base(gpu, stream.name) + k.SS_HEAD] < 0:
            self._hand_back(gpu, stream.name)
            assert stream.ops[0] is stand_in and len(stream.ops) == 1
            stream.ops.popleft()
            stand_in.done = True
            return
        stand_in.d = True
        self.rs[gpu._ri, self._slot_base(gpu, stream.name) + k.SS_SEAL] = 1

    def show_sends(self) -> None:
        """Before the streams are read for a deadlock report (Shard.blocked): a stand-in whose
        messages are done goes, and one with messages left shows its head as the Python op would be
        (its name, whether it started, whether it waits for the compute stream). The run ends there."""
        for stand_in in list(self.stand_ins.values()):
            gpu, stream = stand_in.gpu, stand_in.stream
            head = self.rs.item(gpu._ri, self._slot_base(gpu, stream.name) + k.SS_HEAD)
            if head < 0:
                if not stand_in.d:
                    self.seal(gpu, stream)
                continue
            if self.ops.item(head, k.O_KIND) == k.K_R:
                op = self.recv_op(head)[1]
            else:
                dst, tag = self._pair(self.ops.item(head, k.O_LOST))
                size = self.ops.item(head, k.O_VAL)
                op = Op(SEND, f"send(dst={dst}, tag={tag}, {size} B)", dst, size, tag)
            op.stream, op.gpu = stream, gpu
            op.deps_left = self.ops.item(head, k.O_DEPS)
            op.started = self.ops.item(head, k.O_STATE) == k.S_STARTED
            op.t_start = self.ops.item(head, k.O_TSTART)
            stream.ops[0] = op
        # a block whose first op waits for a kernel receive: its proxy (started, waiting for nothing
        # of Python's) shows as the Python rules' would, waiting for the receive's stream
        for ri, names in self.slot_names.items():
            first = self.rs.item(ri, k.R_CHEAD)
            if first < 0 or not self.ops.item(first, k.O_DEPS):
                continue
            gpu = self.shard.gpus[self.ranks[ri]]
            compute = gpu.streams.get("compute")
            proxy = compute.ops[0] if compute is not None and compute.ops else None
            if proxy is None or proxy.kind != BLOCK or proxy.deps_left:
                continue
            for slot in range(len(names)):
                op = self.rs.item(ri, k.R_SS0 + slot * k.SS_FIELDS + k.SS_HEAD)
                while op >= 0:
                    deps = [self.ops.item(op, k.O_DEP0 + j) for j in range(self.ops.item(op, k.O_NDEP))]
                    if self.ops.item(op, k.O_KIND) == k.K_R and first in deps:
                        proxy.deps_left = 1
                    op = self.ops.item(op, k.O_NEXT)

    def send_drained(self) -> None:
        """The kernels stopped at the last send of a sealed stream (ST_SDRAIN): its stand-in
        completes as that send would in Shard._complete, its counts taken by the kernels."""
        gpu, t = self.resumed()
        self.drained(gpu, self.gm[k.G_SS], t)

    def drained(self, gpu: VirtualGPU, slot: int, t: int, resume: bool = True) -> None:
        """The last kernel op of the sealed stream of ``slot`` completed at ``t``: the stand-in goes
        as that op would (its dependents, the stream's next ops; then the program's check, where
        the kernels stopped before it: ``resume``)."""
        shard = self.shard
        shard.now = t
        name = self.slot_names[gpu._ri][slot]
        stand_in = self._hand_back(gpu, name)
        stand_in.done = True
        stand_in.t_end = t
        stream = stand_in.stream
        stream.ops.popleft()
        dependents = stand_in.dependents
        if dependents is not None:
            stand_in.dependents = None
            for dep in dependents:
                dep.deps_left -= 1
                if dep.deps_left == 0:
                    s = dep.stream
                    s.unblocked_by = name
                    if s.ops and s.ops[0] is dep:
                        shard._try_start(gpu, s)
        if stream.ops:
            shard._try_start(gpu, stream)
        if resume and gpu.suspended and (gpu.sync_op is not None or gpu.outstanding <= shard.max_ahead >> 1):
            shard._maybe_resume(gpu)


def _takes(stream) -> bool:
    """Whether the kernels take ``stream``'s next message with its stand-in in place (as
    :func:`_kernel_stream`, the stand-in made already: OpCore.launch_steps)."""
    if stream is None:
        return False
    ops = stream.ops
    return len(ops) == 1 and ops[0].kind == KSENDS and not ops[0].d


def _kernel_stream(gpu: VirtualGPU, name: str):
    """``gpu``'s stream ``name`` where the kernels may take its next message: empty, or holding
    only their stand-in, not sealed (OpCore.seal); else None (Python's ops come first there)."""
    stream = gpu.streams.get(name)
    if stream is None:
        stream = gpu.stream(name)
    ops = stream.ops
    if ops:
        stand_in = ops[0]
        if stand_in.kind != KSENDS or stand_in.d or len(ops) > 1:
            return None
    return stream

"""A block's template in the compiled per-op engine (split from opcore.py): a prepared block's rows
(tensor_parallel.prepare_segments) turned once into the kernels' template rows - compute ops, allocs
and frees, the tensor group's closed-form collectives with their plans and link lists, the waits
between the block's streams - with its least duration for the lookahead (lookahead.block_bound),
and what a block's alloc and free rows leave when it ends (:func:`_memory_plan`).

A mixin of :class:`emulator.engine.opcore.OpCore`, as opmessages.KernelMessages is: it reads and grows
the core's template tables (``ti``, ``tf``, ``tp``, ``pl``, ``plk``) and repacks them
(``_pack_if_grown``)."""

from __future__ import annotations

import functools

from emulator.engine import opkernels as k
from emulator.engine.lookahead import block_bound
from emulator.engine.opmessages import _grown


class BlockTemplates:
    """The template methods of OpCore (see the module docstring)."""

    def _plan(self, prepared) -> int:
        """The index of a prepared tensor collective's closed-form plan, or -1 when it has none
        (then the block runs in Python)."""
        group, call, algorithm, sig, closed = prepared
        shard = self.shard
        if closed is None or group.cross or not 1 <= closed[1] <= k.MAX_MEMBERS:
            return -1
        if call.ranks not in self.group_index and len(self.group_index) >= self.gr.shape[0]:
            return -1  # (a shard hosts a member of each group it plans: not expected)
        plan = shard._closed_plan(call, algorithm)
        known = self.plan_of.get(id(plan))
        if known is not None and known[0] is plan:
            return known[1]
        _, _, arrivals, links, tx, rx, duration, messages, msg_bytes, per, busy, acc = plan
        # each member of a group has a plan of its own call (its accumulator), with the same figures:
        # the members share the first one's row and accumulator, hence templates (the tensor group's
        # 8 ranks, one template). The same results: the kernels count every call of the row, and
        # ShardStats.flush adds each figure times the calls and keeps the longest wait per link, the
        # totals of one accumulator per member
        alike = (call.ranks, call.op, sig, arrivals, links, tx, rx, duration, messages, msg_bytes, per, busy)
        p = self.plan_alike.get(alike)
        if p is not None:
            self.plan_of[id(plan)] = (plan, p)
            return p
        p = self.n_pl
        pl, plk = self.pl, self.plk
        self.pl = _grown(pl, p + 1)
        self.plk = _grown(plk, self.n_plk + len(links))
        self.plk[self.n_plk : self.n_plk + len(links)] = links
        row = [0] * k.P_FIELDS  # (the counters, P_CALLS ..., start at 0)
        row[k.P_DUR], row[k.P_MSGB], row[k.P_MSGS] = duration, msg_bytes, messages
        row[k.P_MEMBERS], row[k.P_LPTR], row[k.P_LLEN] = call.n, self.n_plk, len(links)
        # the group's row of the arrivals table (one arrival: the member's own slot, read at once)
        row[k.P_ARRIVALS] = arrivals
        row[k.P_GROUP] = self.group_index.setdefault(call.ranks, len(self.group_index))
        row[k.P_SIG] = self.sig_index.setdefault(sig, len(self.sig_index))
        self.pl[p] = row
        self.n_plk += len(links)
        self.n_pl = p + 1
        self.plan_of[id(plan)] = (plan, p)
        self.plan_alike[alike] = p
        self.plan_info.append((acc, call.op))
        if self.pl is not pl or self.plk is not plk:
            self._pack_if_grown()
        return p

    def _template(self, block: list, rank: int) -> tuple[int, bool]:
        """``(template, (tensor group id, its calls) or None)`` for ``rank``; ``(-1, has tensor
        calls)`` when the block is not eligible."""
        faults = self.faults
        slow = faults is not None and rank in faults.ranks
        rows, tp_calls, gid = [], 0, 0
        # a block starts and ends on the compute stream (its proxy's), and runs some compute
        eligible = bool(block) and block[0][0] in "caf" and block[-1][0] in "caf"
        computes = False  # (the loop's "c" rows)
        pending = False
        # collectives since the last compute op (its dependents: at most MAX_DEPS), and the ones the
        # next compute op waits for (launch_rest's R_WAIT0 slots: at most MAX_WAITS): each collective
        # waited for at once, and a "w"'s overlapped one, which may have been launched before that
        # compute op (m(ov) c w m m m m m c: six waits for five collectives in a row)
        waits = 0
        nwait = 0
        # a wait the compute stream's next op owes (a collective waited for at once, a "w"): an alloc
        # or free there would take it (Shard.launch's pending waits); the kernels give them none
        owed = False
        # id(a prepared call) -> (its plan, whether Python runs its group): a joined block repeats a layer's calls
        calls: dict[int, tuple] = {}
        for pos, (kind, a, b, c) in enumerate(block):
            if kind == "a" or kind == "f":
                # (a size the GPU API would refuse: the Python path raises its error; one past 2^50
                # bytes, 1 PiB: the kernels' int64 sums stay far from their bound)
                if owed or type(b) is not int or not 0 <= b < 1 << 50:
                    eligible = False
                rows.append((k.I_A if kind == "a" else k.I_F, b, pos, 0.0))
                continue
            if kind == "c":
                waits = nwait = 0
                owed = False
                computes = True
                if slow:  # Shard.launch's duration as launched, and what it costs (no jitter here)
                    ns = faults.launch_ns(rank, b)
                    rows.append((k.I_C, ns, ns - b, c))
                else:
                    rows.append((k.I_C, b, 0, c))
            elif kind == "m":
                if b != "tp":
                    eligible = False
                    continue
                waits += 1
                nwait += 0 if c else 1
                # (numba checks no bounds: R_WAIT0 + k, O_DEP0 + k would overrun)
                if waits > k.MAX_DEPS or nwait > k.MAX_WAITS:
                    eligible = False
                tp_calls += 1
                gid = a[0].gid
                known = calls.get(id(a))
                if known is None:
                    known = calls[id(a)] = (self._plan(a), self._python_group(a[1].ranks))
                plan, python = known
                if python or plan < 0 or (c and pending):
                    eligible = False
                pending = pending or bool(c)
                owed = owed or not c
                rows.append((k.I_M, plan, 1 if c else 0, 0.0))
            else:
                nwait += 1 if pending else 0
                if nwait > k.MAX_WAITS:
                    eligible = False
                pending = False
                owed = True
                rows.append((k.I_W, 0, 0, 0.0))
        if pending or not computes:
            eligible = False
        if not eligible:
            return -1, tp_calls > 0
        extra = (gid, tp_calls) if tp_calls else None
        # ranks' blocks of the same rows (their plans are their nodes') share a template
        key = tuple(rows)
        b = self.template_of.get(key)
        if b is not None:
            return b, extra
        start, n = self.n_ti, len(rows)
        ti, tf, tp = self.ti, self.tf, self.tp
        self.ti = _grown(ti, start + n)
        self.tf = _grown(tf, start + n)
        self.ti[start : start + n] = [row[:3] for row in rows]
        self.tf[start : start + n] = [row[3] for row in rows]
        self.n_ti += n
        b = self.n_tp
        pl = self.pl  # the lookahead's figures, once per template (lookahead.block_bound)
        steps = [("c", v) if code == k.I_C else ("m", pl.item(v, k.P_DUR), pl.item(v, k.P_ARRIVALS), f)
                 if code == k.I_M else ("w",) for code, v, f, _ in rows if code in (k.I_C, k.I_M, k.I_W)]  # fmt: skip
        steps = tuple(steps)  # the nodes' templates differ in their plans, rarely in these
        bound = self.bound_of.get(steps)
        if bound is None:
            bound = self.bound_of[steps] = block_bound(steps)
        self.bounds.append(bound)
        self.tp = _grown(self.tp, b + 1)
        self.tp[b] = (start, len(rows))
        self.n_tp = b + 1
        self.template_of[key] = b
        if self.ti is not ti or self.tf is not tf or self.tp is not tp:
            self._pack_if_grown()
        return b, extra

    def _python_group(self, ranks: tuple) -> bool:
        """Whether the Python rules run the tensor group ``ranks``: when one of its members is
        traced (api.GPU.launch_block), all do, or the members' arrivals would be split between the
        kernels' table and collective_run's."""
        known = self.python_groups.get(ranks)
        if known is None:
            gpus = self.shard.gpus
            known = self.python_groups[ranks] = any(r in gpus and gpus[r].trace is not None for r in ranks)
        return known


@functools.lru_cache(maxsize=1 << 12)  # (the ranks of a stage make blocks of the same rows: one plan for them)
def _memory_plan(mem_rows: tuple | None) -> tuple | None:
    """What a block's alloc and free rows ``(row, slot, alloc?, bytes, name)`` leave when it ends,
    for OpCore.begin: ``(each slot's last alloc (slot, name, bytes), the slots whose last alloc
    the block does not free, the slots of allocations made before it that it frees)``. The rows
    the built-in workload makes: a slot is allocated (by name, or named by what the caller put
    in it, when that slot has no row before) and freed at most once in turn, or freed once when
    allocated before the block."""
    if mem_rows is None:
        return None
    state: dict[int, str] = {}  # slot -> "live" / "freed" (an alloc of the block's), "ext": freed from before
    last: dict[int, tuple] = {}
    freed = []
    for _, slot, alloc, size, name in mem_rows:
        held = state.get(slot)
        if alloc:
            assert held != "live" and (name is not None or held is None), mem_rows
            state[slot] = "live"
            last[slot] = (slot, name, size)
        else:
            assert held in (None, "live"), mem_rows  # (GPU.free's check: freed twice)
            state[slot] = "freed" if held == "live" else "ext"
            if held is None:
                freed.append(slot)
    kept = tuple(slot for slot, held in state.items() if held == "live")
    return tuple(last.values()), kept, tuple(freed)

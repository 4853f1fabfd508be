"""Turning a stuck run into a report a user can act on: deadlock, collective mismatch, or the hang
that a failed node or link (``faults.fail``, emulator/engine/faults.py) leaves behind."""

from __future__ import annotations

from emulator.engine import opkernels as k
from emulator.engine.ops import ALLOC, BLOCK, COLL, COMM_KINDS, COMPUTE, FREE, RECV, Op
from emulator.errors import CollectiveMismatchError, DeadlockError, FailureError
from netmodel.collectives import ALGORITHMS
from netmodel.collectives.base import OPS

ALGOS = sorted(ALGORITHMS)


def describe_sig(sig: int) -> str:
    """Readable form of a collective signature carried by its messages."""
    op, algo, root, size = OPS[sig & 15], ALGOS[(sig >> 4) & 15], (sig >> 8) & 0xFFFFF, sig >> 28
    rooted = f", root index {root}" if op in ("broadcast", "reduce") else ""
    return f"{op} ({size} B, {algo}{rooted})"


def blocked_ranks(shard) -> list[dict]:
    """For every rank that has not finished: the operations it is stuck in, plain data. In a run
    with failures, also ``failed`` (the rank is down), ``since_ns`` (when the earliest of its
    communications in flight began, None if none) and ``failure`` (the failures, for the report)."""
    result = []
    failures = shard.failures
    report = failures.report() if failures is not None else None
    for rank in sorted(shard.gpus):
        gpu = shard.gpus[rank]
        if gpu.finished and gpu.outstanding == 0:
            continue
        waits, colls, waits_on = [], [], []
        comm = []  # the waits that are communications in flight (a failure report shows those)
        for stream, op, kernel_peers in _heads(shard, gpu):
            if op.kind == RECV:
                waits.append(f"{op.describe()} on stream {stream.name}")
                waits_on.append(op.a)
                comm.append(waits[-1])
            elif op.kind == COLL and op.started:
                if kernel_peers is not None:  # the compiled op engine's (_heads)
                    peers = kernel_peers
                else:
                    peers = shard.collective_waits(gpu, op)
                    arrived = shard.rendezvous.get(op.c)
                    if arrived is not None:  # intra-node fast path: waiting for members to arrive
                        peers = sorted(set(op.a.ranks) - {g.rank for g, _ in arrived})
                shown = f"rank(s) {_short(peers)}" if peers else "messages lost to the failure"
                waits.append(f"{op.describe()} waiting for {shown}")
                waits_on.extend(peers)
                comm.append(waits[-1])
                colls.append({"gid": op.c[0], "seq": op.c[1], "name": op.describe(), "ranks": list(op.a.ranks)})
            elif op.deps_left:
                waits.append(f"{op.describe()} on stream {stream.name} waiting for another stream")
            else:
                waits.append(f"{op.describe()} on stream {stream.name}")
                if op.kind in COMM_KINDS and op.started:  # a send whose message was lost
                    comm.append(waits[-1])
        entry = {"rank": rank, "time_ns": gpu.last_time, "waits": waits, "colls": colls, "waits_on": waits_on}
        if report is not None:
            starts = [s.ops[0].t_start for s in gpu.streams.values()
                      if s.ops and s.ops[0].started and s.ops[0].kind in COMM_KINDS]  # fmt: skip
            entry.update(failed=rank in failures.rank_ns, since_ns=min(starts, default=None), failure=report,
                         comm=comm)  # fmt: skip
        result.append(entry)
    return result


def _heads(shard, gpu):
    """``(stream, its head op, the members it waits for or None)`` for each of the rank's streams
    with ops, in the order the Python op engine made them, their ops as that engine would hold
    them. Where the compiled op engine (opcore.py) holds them: a block's proxy at the head of
    ``compute`` is the block's op at the head of the kernels' compute stream, and the tensor stream
    (empty on the shard: OpCore.claim made it where the Python rules would) has the kernels' head
    collective; one started there waits for the members its group's open call lacks (the kernels'
    arrivals, as collective_run's rendezvous)."""
    compute = gpu.streams.get("compute")
    kernel = None
    if compute is not None and any(op.kind == BLOCK for op in compute.ops):
        kernel = _kernel_heads(shard.ops_core, gpu, compute)
    for stream in gpu.streams.values():
        ops = stream.ops
        if ops and ops[0].kind == BLOCK:
            yield stream, *kernel[0]
        elif ops:
            yield stream, ops[0], None
        elif stream.name == "tp" and kernel is not None and kernel[1] is not None:
            yield stream, *kernel[1]


def _kernel_heads(core, gpu, compute) -> tuple:
    """The heads of the kernels' compute and tensor streams for the blocks whose proxies are on
    ``compute``: ``(op, peers)`` each as :func:`_heads` yields them (None: nothing there). A stream
    completes its ops in order, so of the rows the kernels were given (a block launched half way,
    ST_SUSPEND, has rows up to ``R_BPOS``; one not begun, ``R_BEGIN``, none) the head is the first
    of the last ones still queued there."""
    rs, ops = core.rs, core.ops
    ri = gpu._ri
    proxies = [op for op in compute.ops if op.kind == BLOCK]
    rows_c, rows_t = [], []  # (proxy, position) of the rows given to the kernels, by stream
    later = 0  # collectives claimed (OpCore.claim: counted as launched) but not given yet
    for i, proxy in enumerate(proxies):
        block = proxy.known[0]
        given = len(block)
        if i == len(proxies) - 1:  # the last one launched: maybe not (wholly) given yet
            given = 0 if rs.item(ri, k.R_BEGIN) >= 0 else min(given, rs.item(ri, k.R_BPOS))
            later = sum(row[0] == "m" for row in block[given:])
        for pos in range(given):
            kind = block[pos][0]
            if kind == "m":
                rows_t.append((proxy, pos))
            elif kind != "w":
                rows_c.append((proxy, pos))
    heads = []
    for rows, field in ((rows_c, k.R_CHEAD), (rows_t, k.R_THEAD)):
        queued, op = [], rs.item(ri, field)
        while op >= 0:
            queued.append(op)
            op = ops.item(op, k.O_NEXT)
        if not queued and field == k.R_CHEAD and compute.ops[0].kind == BLOCK:
            # the head block not begun (R_BEGIN: the program suspended right after its proxy's
            # launch): the Python rules would hold its first op, waiting where the proxy waits
            heads.append((compute.ops[0], 0, 0, compute.ops[0].deps_left, False, -1))
            continue
        assert len(queued) <= len(rows), (gpu.rank, field, len(queued), len(rows))
        if not queued:
            heads.append(None)
            continue
        proxy, pos = rows[len(rows) - len(queued)]
        head = queued[0]
        deps = ops.item(head, k.O_DEPS) + (proxy.deps_left if ops.item(head, k.O_GATE) else 0)
        started = ops.item(head, k.O_STATE) == k.S_STARTED
        heads.append((proxy, pos, len(queued), deps, started, head))
    shown_c = shown_t = None
    if heads[0] is not None:
        proxy, pos, _, deps, started, _ = heads[0]
        op = _block_op(proxy, pos)
        op.stream, op.gpu, op.deps_left, op.started = compute, gpu, deps, started
        shown_c = (op, None)
    if heads[1] is not None:
        proxy, pos, queued, deps, started, head = heads[1]
        group, call, algorithm, sig, _ = proxy.known[0][pos][1]
        # numbered as GPU.launch_collective numbers it (OpCore.claim counted every claimed block's
        # calls; a rank's tensor group is one, as its blocks' tp rows)
        op = Op(COLL, None, call, algorithm, (group.gid, gpu.coll_seq[group.gid] - queued - later), sig)
        op.stream, op.gpu, op.deps_left, op.started = gpu.streams["tp"], gpu, deps, started
        peers = None
        if started:
            gr = core.gr[core.pl.item(ops.item(head, k.O_VAL), k.P_GROUP)]
            arrived = {core.ranks[gr.item(k.GR_MEM0 + 2 * j)] for j in range(gr.item(k.GR_N))}
            peers = sorted(set(call.ranks) - arrived)
        shown_t = (op, peers)
    return shown_c, shown_t


def _block_op(proxy, pos: int) -> Op:
    """The op of row ``pos`` of a compiled block (its proxy's) as tensor_parallel.launch_prepared
    launches it: a compute op named with the block's suffix, an alloc or a free named after its
    allocation (the block's memory slots as given at launch, OpCore._proxy, then its own allocs)."""
    block = proxy.known[0]
    kind, a, b, c = block[pos]
    if kind == "c":
        return Op(COMPUTE, a + proxy.suffix, b, c)
    memory = list(proxy.mem[3]) if proxy.mem is not None else []
    memory.extend([None] * (a + 1 - len(memory)))
    for row in block[:pos]:
        if row[0] == "a":
            memory[row[1]] = memory[row[1]] if row[3] is None else row[3]
    if kind == "a":
        return Op(ALLOC, f"alloc({memory[a] if c is None else c})")
    return Op(FREE, f"free({getattr(memory[a], 'name', memory[a])})")


def _short(items: list, limit: int = 6) -> str:
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def raise_for_stuck(blocked: list[dict]) -> None:
    """Raise CollectiveMismatchError when members of a group diverged, else DeadlockError."""
    if not blocked:
        return
    if "failure" in blocked[0]:
        raise_for_failure(blocked)
    by_rank = {b["rank"]: b for b in blocked}
    for b in blocked:
        for coll in b["colls"]:
            others = []
            for peer in coll["ranks"]:
                if peer == b["rank"]:
                    continue
                peer_b = by_rank.get(peer)
                same = peer_b is not None and any(
                    c["gid"] == coll["gid"] and c["seq"] == coll["seq"] for c in peer_b["colls"]
                )
                if same:
                    continue
                if peer_b is None:
                    others.append(f"rank {peer} finished its program")
                else:
                    state = "; ".join(peer_b["waits"]) or "idle"
                    others.append(f"rank {peer} is in {state}")
            if others:
                raise CollectiveMismatchError(
                    f"collective mismatch: rank {b['rank']} is in {coll['name']} but "
                    + "; ".join(others[:4])
                    + (f" (+{len(others) - 4} more)" if len(others) > 4 else "")
                )
    parts = [f"rank {b['rank']} (t={b['time_ns'] / 1e9:.6f} s): {'; '.join(b['waits']) or 'no runnable op'}"
             for b in blocked[:6]]  # fmt: skip
    more = f" (+{len(blocked) - 6} more ranks)" if len(blocked) > 6 else ""
    raise DeadlockError(
        f"deadlock: {len(blocked)} rank(s) blocked forever{_cycle(by_rank)}: " + " | ".join(parts) + more
    )


HUNG_SHOWN = 4  # hung operations a failure report names


def raise_for_failure(blocked: list[dict]) -> None:
    """The hang a failure left: raise :class:`FailureError` stopped at the collective timeout.

    The stop time is when the first surviving rank has waited ``collective_timeout_s`` in a
    communication that will never end (PyTorch's NCCL watchdog measures each collective from its
    start): the earliest ``since_ns`` among them plus the timeout. Waits that began before the
    failure time out earlier than ``failure + timeout``, but never before the failure itself: the
    emulator does not time out a wait it would have ended. When no surviving rank waits (only failed
    ranks are unfinished), it is the first failure plus the timeout. Ranks of all shards come in,
    sorted here, so the line is the same on any number of shards. Every stuck rank of a run with
    a failure is reported as hung on it, even one that a bug of the program would have stuck too.
    """
    failure = blocked[0]["failure"]
    timeout_ns, first_ns = failure["timeout_ns"], failure["first_ns"]
    hung = sorted((b for b in blocked if not b["failed"]), key=lambda b: (_since(b), b["rank"]))
    failed = len(blocked) - len(hung)
    waits = [_since(b) for b in hung if b["since_ns"] is not None]
    stop_ns = max(first_ns, min(waits) + timeout_ns) if waits else first_ns + timeout_ns
    what = "; ".join(f"{name} failed at t={at_ns / 1e9:.6f} s" for name, at_ns in failure["what"])
    parts = [f"rank {b['rank']} (since t={_since(b) / 1e9:.6f} s): {'; '.join(b['comm'] or b['waits']) or 'idle'}"
             for b in hung[:HUNG_SHOWN]]  # fmt: skip
    more = f" (+{len(hung) - HUNG_SHOWN} more ranks)" if len(hung) > HUNG_SHOWN else ""
    down = f" ({failed} more on the failed node(s))" if failed else ""
    error = FailureError(
        f"{what}; the collective timeout ({timeout_ns / 1e9:g} s) fires at t={stop_ns / 1e9:.6f} s: "
        f"{len(hung)} rank(s) hung{down}" + (": " + " | ".join(parts) + more if parts else "")
    )
    error.stop_ns = stop_ns
    error.failed_at_ns = first_ns
    raise error


def _since(b: dict) -> int:
    """When a hung rank began waiting: its earliest communication in flight, else its last op's end."""
    return b["since_ns"] if b["since_ns"] is not None else b["time_ns"]


def _cycle(by_rank: dict[int, dict]) -> str:
    """A cycle of ranks each waiting for the next, if there is one (the classic receive-first bug)."""
    for start in sorted(by_rank):
        path, seen = [start], {start}
        rank = start
        while True:
            nxt = next((r for r in by_rank[rank].get("waits_on", []) if r in by_rank), None)
            if nxt is None:
                break
            if nxt in seen:
                loop = path[path.index(nxt) :] + [nxt]
                shown = (
                    " <- ".join(map(str, loop))
                    if len(loop) <= 9
                    else " <- ".join([*map(str, loop[:4]), "...", *map(str, loop[-3:])])
                )
                return f" (wait cycle of {len(loop) - 1} ranks: {shown})"
            path.append(nxt)
            seen.add(nxt)
            rank = nxt
    return ""

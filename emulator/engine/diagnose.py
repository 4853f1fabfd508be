"""Turning a stuck run into a report a user can act on: deadlock, collective mismatch, or the hang
that a failed node or link (``faults.fail``, emulator/engine/faults.py) leaves behind."""

from __future__ import annotations

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
        for stream, op in _heads(gpu):
            if op.kind == RECV:
                waits.append(f"{op.describe()} on stream {stream.name}")
                waits_on.append(op.a)
                comm.append(waits[-1])
            elif op.kind == COLL and op.started:
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


def _heads(gpu):
    """``(stream, its head op)`` for each of the rank's streams with ops, in the order the Python
    op engine made them, its ops as that engine would hold them: a compiled block's proxy at the
    head of ``compute`` (opcore.py) is the block's first op, and the tensor stream the kernels hold
    (empty on the shard: OpCore.claim made it where the Python rules would) has the first
    collective of the blocks still to run at its head."""
    compute = gpu.streams.get("compute")
    for stream in gpu.streams.values():
        ops = stream.ops
        if ops:
            op = ops[0]
            yield stream, (_block_head(op, stream) if op.kind == BLOCK else op)
        elif stream.name == "tp" and compute is not None:
            op = _kernel_collective(gpu, compute, stream)
            if op is not None:
                yield stream, op


def _block_head(proxy, stream) -> Op:
    """The first op of a compiled block (its proxy's), as the Python op engine would launch it
    (tensor_parallel.launch_prepared). A block stuck in a deadlock has not begun: the kernels run a
    begun block to its end alone (its collectives have one arrival, opcore.py), so the first op
    waits where the proxy waits (OpCore.show_sends: for a kernel receive too)."""
    kind, a, b, c = proxy.known[0][0]
    if kind == "c":
        op = Op(COMPUTE, a + proxy.suffix, b, c)
    else:  # an alloc or free of its slot ``a`` (OpCore._proxy keeps the allocations given at launch)
        given = proxy.mem[3] if proxy.mem is not None else [None] * (a + 1)
        if kind == "a":
            op = Op(ALLOC, f"alloc({given[a] if c is None else c})")
        else:
            op = Op(FREE, f"free({getattr(given[a], 'name', given[a])})")
    op.stream, op.gpu, op.deps_left = stream, proxy.gpu, proxy.deps_left
    return op


def _kernel_collective(gpu, compute, stream) -> Op | None:
    """The head of a tensor stream the kernels hold: the first collective of the blocks whose
    proxies wait on ``compute`` (the earlier blocks ran all theirs), numbered as GPU.launch_collective
    numbers it (OpCore.claim counted every claimed block's), waiting for the compute op before it."""
    first, later = None, 0
    for proxy in compute.ops:
        if proxy.kind != BLOCK or not proxy.known[2]:
            continue
        gid, calls = proxy.known[2]  # (the block's tensor group, its calls)
        if first is None:
            first = next(row[1] for row in proxy.known[0] if row[0] == "m")
        if gid == first[0].gid:
            later += calls
    if first is None:
        return None
    group, call, algorithm, sig, _ = first
    op = Op(COLL, None, call, algorithm, (group.gid, gpu.coll_seq[group.gid] - later), sig)
    op.stream, op.gpu, op.deps_left = stream, gpu, 1  # (its block has not begun: _block_head)
    return op


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

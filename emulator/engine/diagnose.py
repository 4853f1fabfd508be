"""Turning a stuck run into a report a user can act on: deadlock or collective mismatch."""

from __future__ import annotations

from emulator.engine.ops import COLL, RECV
from emulator.errors import CollectiveMismatchError, DeadlockError
from netmodel.collectives import ALGORITHMS
from netmodel.collectives.base import OPS

ALGOS = sorted(ALGORITHMS)


def describe_sig(sig: int) -> str:
    """Readable form of a collective signature carried by its messages."""
    op, algo, root, size = OPS[sig & 15], ALGOS[(sig >> 4) & 15], (sig >> 8) & 0xFFFFF, sig >> 28
    rooted = f", root index {root}" if op in ("broadcast", "reduce") else ""
    return f"{op} ({size} B, {algo}{rooted})"


def blocked_ranks(shard) -> list[dict]:
    """For every rank that has not finished: the operations it is stuck in, plain data."""
    result = []
    for rank in sorted(shard.gpus):
        gpu = shard.gpus[rank]
        if gpu.finished and gpu.outstanding == 0:
            continue
        waits, colls, waits_on = [], [], []
        for stream in gpu.streams.values():
            if not stream.ops:
                continue
            op = stream.ops[0]
            if op.kind == RECV:
                waits.append(f"{op.describe()} on stream {stream.name}")
                waits_on.append(op.a)
            elif op.kind == COLL and op.started:
                peers = shard.collective_waits(gpu, op)
                arrived = shard.rendezvous.get(op.c)
                if arrived is not None:  # intra-node fast path: waiting for members to arrive
                    peers = sorted(set(op.a.ranks) - {g.rank for g, _ in arrived})
                waits.append(f"{op.describe()} waiting for rank(s) {_short(peers)}")
                waits_on.extend(peers)
                colls.append({"gid": op.c[0], "seq": op.c[1], "name": op.describe(), "ranks": list(op.a.ranks)})
            elif op.deps_left:
                waits.append(f"{op.describe()} on stream {stream.name} waiting for another stream")
            else:
                waits.append(f"{op.describe()} on stream {stream.name}")
        result.append({"rank": rank, "time_ns": gpu.last_time, "waits": waits, "colls": colls,
                       "waits_on": waits_on})  # fmt: skip
    return result


def _short(items: list, limit: int = 6) -> str:
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def raise_for_stuck(blocked: list[dict]) -> None:
    """Raise CollectiveMismatchError when members of a group diverged, else DeadlockError."""
    if not blocked:
        return
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

"""The conservative round protocol, independent of where shards live.

Each round: every shard reports the time of its earliest pending event; no shard can emit a
cross-shard message stamped earlier than that time plus the lookahead (the minimum cross-node
latency), so every shard may safely process all events before ``T = min(next) + lookahead``. The
cross-shard messages produced are exchanged in one batch per shard pair, and the next round starts.
Rounds jump over idle virtual time by construction. A single shard needs no rounds at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

INF = float("inf")


class ShardLike(Protocol):
    def next_time(self) -> float: ...
    def run_until(self, horizon: float) -> dict[int, list]: ...
    def deliver(self, records: list) -> None: ...


def plan_shards(num_nodes: int, shards: int) -> list[list[int]]:
    """Whole nodes per shard, contiguous blocks (tensor groups and nearby ranks stay together)."""
    shards = max(1, min(shards, num_nodes))
    base, extra = divmod(num_nodes, shards)
    plan, start = [], 0
    for i in range(shards):
        size = base + (1 if i < extra else 0)
        plan.append(list(range(start, start + size)))
        start += size
    return plan


def run_rounds(
    shards: Sequence[ShardLike],
    lookahead_ns: int,
    progress: Callable[[int, float], None] | None = None,
    progress_window_ns: float = INF,
) -> int:
    """Drive in-process shards to the end; returns the number of rounds.

    ``progress(rounds, horizon)`` is called after every round; with one shard the horizon still
    advances in ``progress_window_ns`` steps so that a live display has something to show (the
    horizon never changes results, only how the work is cut).
    """
    rounds = 0
    single = len(shards) == 1
    while True:
        t_min = min(s.next_time() for s in shards)
        if t_min == INF:
            return rounds
        horizon = t_min + (progress_window_ns if single else lookahead_ns)
        outs = [s.run_until(horizon) for s in shards]
        rounds += 1
        for out in outs:
            for dst, records in sorted(out.items()):
                shards[dst].deliver(records)
        if progress is not None:
            progress(rounds, horizon)

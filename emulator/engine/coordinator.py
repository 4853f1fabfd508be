"""The conservative round protocol, independent of where shards live.

Each round: every shard reports the time of its earliest pending event; no shard can emit a
cross-shard message stamped earlier than that time plus the lookahead (the minimum cross-node
latency), so every shard may safely process all events before ``T = min(next) + lookahead``. The
cross-shard messages produced are exchanged in one batch per shard pair, and the next round starts.
Rounds jump over idle virtual time by construction. A single shard needs no rounds at all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

INF = float("inf")


class ShardLike(Protocol):
    def next_time(self) -> float: ...
    def run_until(self, horizon: float) -> dict[int, list]: ...
    def deliver(self, records: list) -> None: ...
    def live_stats(self) -> dict: ...


class Observer(Protocol):
    """Receives live progress (Prometheus exporter, progress bar); never changes results.

    An observer may also define ``note_cross_shard_messages(total: int)``: it is then called just
    before each ``update`` with the number of cross-shard messages exchanged so far.
    """

    def update(self, rounds: int, virtual_time_ns: float, shard_stats: list[dict]) -> None: ...


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


class RoundStats:
    """Counters of the protocol itself."""

    def __init__(self) -> None:
        self.rounds = 0
        self.cross_shard_messages = 0


OBSERVE_EVERY_S = 0.5  # wall seconds between live observations
WINDOW_NS = 1e7  # virtual time a single observed shard advances per round


def horizon_step(shards: int, lookahead_ns: int, observed: bool, window_ns: float = WINDOW_NS) -> float:
    """How far past the earliest pending event a round may go (the conservative rule; every backend)."""
    if shards > 1:
        return lookahead_ns
    return window_ns if observed else INF


def run_rounds(
    shards: Sequence[ShardLike],
    lookahead_ns: int,
    observer: Observer | None = None,
    observe_every_s: float = OBSERVE_EVERY_S,
    window_ns: float = WINDOW_NS,
) -> RoundStats:
    """Drive shards to the end of the run.

    With one shard and no observer everything runs in a single call. With an observer, a single
    shard still advances in ``window_ns`` slices of virtual time so that live figures move; how the
    work is cut never changes results.
    """
    stats = RoundStats()
    step = horizon_step(len(shards), lookahead_ns, observer is not None, window_ns)
    last_observed = time.monotonic()
    t_min = 0.0
    while True:
        t_min = min(s.next_time() for s in shards)
        if t_min == INF:
            break
        horizon = t_min + step
        outs = [s.run_until(horizon) for s in shards]
        stats.rounds += 1
        for out in outs:
            for dst, records in sorted(out.items()):
                stats.cross_shard_messages += len(records)
                shards[dst].deliver(records)
        if observer is not None and time.monotonic() - last_observed >= observe_every_s:
            last_observed = time.monotonic()
            publish(observer, stats.rounds, stats.cross_shard_messages, t_min, [s.live_stats() for s in shards])
    if observer is not None:
        publish(observer, stats.rounds, stats.cross_shard_messages, t_min, [s.live_stats() for s in shards])
    return stats


def publish(observer: Observer, rounds: int, cross_shard_messages: int, t_min: float, shard_stats: list) -> None:
    """Hand live figures to an observer (shared by every backend)."""
    note = getattr(observer, "note_cross_shard_messages", None)
    if note is not None:
        note(cross_shard_messages)
    observer.update(rounds, t_min, shard_stats)

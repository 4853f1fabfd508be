"""The conservative round protocol, independent of where shards live (one process, or Ray actors).

Each round, shard ``j`` may process every event stamped before ``H_j``, the earliest time a message
from another shard could still reach it. After a round every shard ``i`` reports its next event
time ``T_i``, for each shard ``j`` a lower bound ``c_ij`` on the start of its next send to ``j``
that no new arrival causes, and ``d_i``, the least time between an arrival and a send it causes
(emulator/engine/lookahead.py). Shard ``i``'s next send to ``j`` therefore starts no earlier than

    s_ij = min(max(c_ij, T_i), e_i + d_i, X_i + d_i)

(``e_i``: the earliest record on its way to ``i``; ``X_i``: its next arrival, no earlier than
``H_i``) and reaches ``j`` no earlier than ``s_ij + L``, ``L`` being the smallest cross-shard
latency. The horizons are the least solution of ``H_j = min over i != j of (min(s_ij, H_i + d_i) +
L)``: shortest paths with positive weights, hence safe (every true arrival time satisfies the same
inequalities), and the shard with the globally earliest event can always advance.
The cross-shard messages produced are exchanged in one batch per shard pair, and the next round
starts. A single shard needs no rounds at all (one call, or ``window_ns`` slices when observed).

:func:`drive` is the one run sequence of every backend: start, rounds, finish, merge. A backend
supplies a :class:`Transport` that moves the calls and the batches (in-process: method calls;
Ray: actor calls or a compiled graph).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from emulator.engine.diagnose import raise_for_stuck

INF = float("inf")

OBSERVE_EVERY_S = 0.5  # wall seconds between live observations
WINDOW_NS = 1e7  # virtual time a single observed shard advances per round


class Observer(Protocol):
    """Receives live progress (Prometheus exporter, progress bar); never changes results.

    An observer may also define ``note_cross_shard_messages(total: int)``: it is then called just
    before each ``update`` with the number of cross-shard messages exchanged so far.
    """

    def update(self, rounds: int, virtual_time_ns: float, shard_stats: list[dict]) -> None: ...


# What a shard answers to a step: (next event time, output bound, {dst: (count, earliest, payload)},
# live stats or None, wall seconds the shard worked on it). The payload is whatever the
# transport's ``step`` accepts back as inbound.
StepReply = tuple[float, float, dict, "dict | None", float]


class Transport(Protocol):
    """Where the shards live and how calls and batches reach them."""

    shards: int
    world_size: int

    def start(self) -> dict[int, StepReply]:
        """Build the shards and run every program to its first suspension; a reply per shard."""

    def step(self, work: dict[int, tuple[float, list, bool]]) -> dict[int, StepReply]:
        """One round on the given shards: ``{shard: (horizon, inbound payloads, want_stats)}``."""

    def finish(self) -> list[tuple[list, dict, dict]]:
        """Every shard's ``(blocked ranks, exported results, last live stats)``, in shard order."""

    def salvage(self, lost: set[int]) -> list[dict | None]:
        """After a failure or Ctrl-C: each shard's results so far, None for a shard that cannot
        answer (``lost``: known lost with its host, not asked); in shard order. Called at most
        once, never after ``finish``."""


@dataclass
class RoundStats:
    """Counters of the protocol itself."""

    rounds: int = 0
    cross_shard_messages: int = 0
    virtual_time_ns: float = 0.0  # the earliest pending event when the run stopped (or ended)
    # wall seconds of the rounds beyond their busiest shard's work: what the protocol and the
    # transport cost (calls, batches, the driver), per run; / rounds = the overhead of one round
    overhead_s: float = 0.0


def next_horizons(done: Sequence[float], nexts: Sequence[float], bounds: Sequence[tuple[list, float]],
                  arriving: Sequence[float], lookahead_ns: float) -> list[float]:  # fmt: skip
    """Each shard's horizon for the next round (see the module docstring); never below ``done``.

    ``bounds[i]`` is shard i's ``(to, delay)``: ``to[j]`` bounds its next send to shard j that no new
    arrival causes, ``delay`` the least time between an arrival and a send it causes.
    """
    n = len(nexts)
    # sends[i][j]: the earliest shard i can send to j, arrivals still to come aside
    sends = [[min(max(to, nexts[i]), arriving[i] + bounds[i][1]) for to in bounds[i][0]] for i in range(n)]
    horizons = [min(sends[i][j] for i in range(n) if i != j) + lookahead_ns for j in range(n)]
    # what an arrival at i (no earlier than its horizon) makes i send to anyone: shortest paths whose
    # edges out of i all weigh d_i + L > 0, so one pass settles them (a path through a second relay
    # is never shorter than the direct edge out of the first)
    relay = [horizons[i] + bounds[i][1] + lookahead_ns for i in range(n)]
    best = min(range(n), key=relay.__getitem__)
    runner_up = min(relay[i] for i in range(n) if i != best)
    horizons = [min(h, runner_up if j == best else relay[best]) for j, h in enumerate(horizons)]
    return [h if h > d else d for h, d in zip(horizons, done, strict=True)]


def drive(transport: Transport, lookahead_ns: int, observer: Observer | None = None,
          observe_every_s: float = OBSERVE_EVERY_S, window_ns: float = WINDOW_NS):  # fmt: skip
    """Run to the end: start, rounds, finish; returns the merged ``RunResult``.

    Raises the run's own errors (deadlock, mismatch, OOM, program errors) as the shards meet them.
    Whatever escapes (those, a lost shard, Ctrl-C) carries what the run reached, for a failed run's
    summary: ``exc.round_stats`` (the :class:`RoundStats` so far; its ``virtual_time_ns`` is the
    earliest pending event of the last round, a time every shard had reached) and
    ``exc.partial_result``: the merged ``RunResult`` of everything that ran - every shard's when
    they all ran to their end with ranks left stuck (deadlock, mismatch), else what the shards that
    still answer measured up to where they stopped (:meth:`Transport.salvage`; ranks of a lost shard
    are missing); None when no shard answers.
    """
    from emulator.summary import merge

    stats = RoundStats()
    result = None
    finished = None
    try:
        finished = run_rounds(transport, lookahead_ns, stats, observer, observe_every_s, window_ns)
        result = merge(transport.world_size, [export for _, export, _ in finished], stats.rounds,
                       stats.cross_shard_messages)  # fmt: skip
        result.extra["round_overhead_s"] = stats.overhead_s
        raise_for_stuck([b for blocked, _, _ in finished for b in blocked])
    except BaseException as exc:
        if result is None and finished is None:
            lost = getattr(exc, "shard", None)  # a lost shard (BackendError) is not asked
            result = salvage(transport, stats, {lost} if lost is not None else set())
        exc.round_stats, exc.partial_result = stats, result
        raise
    return result


def salvage(transport: Transport, stats: RoundStats, lost: set[int]):
    """The merged results so far of the shards that still answer, or None.

    Best effort by design: it runs while an error or Ctrl-C is on its way out, and that error is
    what the user must see, so a failure here only means there is no partial result.
    """
    from emulator.summary import merge

    try:
        exports = [e for e in transport.salvage(lost) if e is not None]
        if not exports:
            return None
        result = merge(transport.world_size, exports, stats.rounds, stats.cross_shard_messages, partial=True)
    except Exception:  # the shard's state after the failure may not export; the error still goes out
        return None
    result.extra["round_overhead_s"] = stats.overhead_s
    return result


def run_rounds(transport: Transport, lookahead_ns: int, stats: RoundStats, observer: Observer | None = None,
               observe_every_s: float = OBSERVE_EVERY_S, window_ns: float = WINDOW_NS) -> list:  # fmt: skip
    """The rounds of :func:`drive`; ``stats`` is updated as they go (a failed run keeps them).

    A shard with no event before its horizon and nothing inbound would do nothing: it is skipped
    (every shard takes part in observed rounds). How the work is cut never changes results.
    """
    n = transport.shards
    nexts, bounds, done = [INF] * n, [INF] * n, [0.0] * n
    inbox: list[list] = [[] for _ in range(n)]
    arriving = [INF] * n  # earliest record on its way to each shard

    def receive(replies: dict) -> None:
        for i in replies:
            nexts[i], bounds[i] = replies[i][0], replies[i][1]
        for i in sorted(replies):  # source-shard order: every backend delivers in this order
            for dst, (count, earliest, payload) in sorted(replies[i][2].items()):
                stats.cross_shard_messages += count
                inbox[dst].append(payload)
                if earliest < arriving[dst]:
                    arriving[dst] = earliest

    receive(transport.start())
    last_observed = time.monotonic()
    while True:
        pending = [min(a, b) for a, b in zip(nexts, arriving, strict=True)]
        t_min = min(pending)
        stats.virtual_time_ns = t_min
        if t_min == INF:
            break
        if n == 1:
            horizons = [t_min + window_ns if observer is not None else INF]
        else:
            horizons = next_horizons(done, nexts, bounds, arriving, lookahead_ns)
        due = observer is not None and time.monotonic() - last_observed >= observe_every_s
        busy = [i for i in range(n) if due or inbox[i] or pending[i] < horizons[i]]
        work = {i: (horizons[i], inbox[i], due) for i in busy}
        started = time.perf_counter()
        replies = transport.step(work)
        stats.overhead_s += time.perf_counter() - started - max(r[4] for r in replies.values())
        stats.rounds += 1
        for i in busy:
            inbox[i], arriving[i], done[i] = [], INF, horizons[i]
        receive(replies)
        if due:
            last_observed = time.monotonic()
            publish(observer, stats.rounds, stats.cross_shard_messages, t_min, [replies[i][3] for i in range(n)])
    finished = transport.finish()
    if observer is not None:
        publish(observer, stats.rounds, stats.cross_shard_messages, t_min, [f[2] for f in finished])
    return finished


def publish(observer: Observer, rounds: int, cross_shard_messages: int, t_min: float, shard_stats: list) -> None:
    """Hand live figures to an observer (shared by every backend)."""
    note = getattr(observer, "note_cross_shard_messages", None)
    if note is not None:
        note(cross_shard_messages)
    observer.update(rounds, t_min, shard_stats)

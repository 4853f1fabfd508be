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
Ray: actor calls), or a :class:`DirectTransport` whose shards each keep a copy
of the protocol's state (:class:`Rounds`) and exchange their replies with each other (Ray: direct
connections between the shard actors).
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
UNOBSERVED_EVERY_S = 2.0  # wall seconds between a driver's checks on shards that run rounds themselves


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
        """One round on the given shards: ``{shard: (horizon, inbound payloads, want_stats)}``.
        Every shard runs its round even when another raises (a run's error: OOM, program error...);
        then the first of those errors in event order is raised (:func:`first_error`)."""

    def finish(self) -> list[tuple[list, dict, dict]]:
        """Every shard's ``(blocked ranks, exported results, last live stats)``, in shard order."""

    def salvage(self, lost: set[int]) -> list[dict | None]:
        """After a failure or Ctrl-C: each shard's results so far, None for a shard that cannot
        answer (``lost``: known lost with its host, not asked); in shard order. Called at most
        once, never after ``finish``."""


class DirectTransport(Transport, Protocol):
    """A transport whose shards run the rounds among themselves, each with its own :class:`Rounds`,
    exchanging replies shard to shard (``actors/peer.py``): no round passes through the driver.
    ``start`` then returns nothing, and ``step`` is never called."""

    exchanges_directly: bool  # True
    reached: tuple | None  # after ``salvage``: the counters as ``advance`` returns them, if any shard answered

    def advance(self, budget_s: float, want_stats: bool) -> tuple[bool, tuple, list]:
        """Let the shards run rounds for about ``budget_s`` wall seconds (they stop together, after
        the same round); returns ``(ended, RoundStats.counters() of the rounds so far, live stats per
        shard or Nones)``. Raises, of the errors the shards met in their last round, the first in
        event order (:func:`first_error`)."""


@dataclass
class RoundStats:
    """Counters of the protocol itself."""

    rounds: int = 0
    cross_shard_messages: int = 0
    virtual_time_ns: float = 0.0  # the earliest pending event when the run stopped (or ended)
    # wall seconds of the rounds beyond their busiest shard's work: what the protocol and the
    # transport cost (calls, batches, the driver), per run; / rounds = the overhead of one round
    overhead_s: float = 0.0
    critical_s: float = 0.0  # the busiest shard's work of each round, summed: what N hosts wait for

    def counters(self) -> tuple:
        """What a shard that runs rounds itself reports to the driver (``DirectTransport.advance``)."""
        return self.rounds, self.cross_shard_messages, self.virtual_time_ns, self.overhead_s, self.critical_s

    def take(self, counters: tuple) -> None:
        self.rounds, self.cross_shard_messages, self.virtual_time_ns, self.overhead_s, self.critical_s = counters


def first_error(errors: Sequence[BaseException]) -> BaseException:
    """Of the errors the shards met in one round (in shard order), the one a single shard meets.

    Each shard stops at its own first error, marked with the key of the event that raised it
    (``event_key``, emulator/engine/events.py at_event); the least key wins. Comparing the shards'
    first errors of one round is enough: in a round, shard ``j`` processes only events before its
    horizon ``H_j``, and nothing another shard does in that round reaches ``j`` before ``H_j`` (the
    horizons bound every arrival from below, module docstring), so every event a shard processed
    in the round - its error's included - happens as on one shard, whatever the others did in the
    round; on one shard the run stops at the least of these errors and meets none of the others.
    An error an earlier round met stopped the run there. An error without a key (not met at an
    event: a bug in the protocol) goes first, in shard order, as before.
    """
    def order(i: int) -> tuple:
        key = getattr(errors[i], "event_key", None)
        return (0, i) if key is None else (1, key)

    return errors[min(range(len(errors)), key=order)]


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
    from emulator.engine.result import merge

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
    from emulator.engine.result import merge

    try:
        exports = [e for e in transport.salvage(lost) if e is not None]
        reached = getattr(transport, "reached", None)  # a DirectTransport's shards kept the counters
        if reached is not None:
            stats.take(reached)
        if not exports:
            return None
        result = merge(transport.world_size, exports, stats.rounds, stats.cross_shard_messages, partial=True)
    except Exception:  # the shard's state after the failure may not export; the error still goes out
        return None
    result.extra["round_overhead_s"] = stats.overhead_s
    return result


class Rounds:
    """The protocol's state: what every shard last reported, what is on its way to each shard.

    One copy lives in the driver (``run_rounds``: transports that step the shards on call), or one
    in every shard (a transport whose shards exchange their replies directly, ``actors/peer.py``):
    the same replies received in the same order give every copy the same horizons, so both ways
    run the same rounds. A reply is ``(next event time, output bound, {dst: (count, earliest,
    payload)})``; a copy that is not ``dst``'s may hold None for the payload (only the count and
    the earliest time decide the horizons).
    """

    def __init__(self, shards: int, lookahead_ns: float, window_ns: float = WINDOW_NS, observed: bool = False):
        n = shards
        self.n, self.lookahead_ns, self.window_ns, self.observed = n, lookahead_ns, window_ns, observed
        self.nexts, self.bounds, self.done = [INF] * n, [INF] * n, [0.0] * n
        self.inbox: list[list] = [[] for _ in range(n)]
        self.arriving = [INF] * n  # earliest record on its way to each shard
        self.stats = RoundStats()

    def receive(self, replies: dict) -> None:
        """Take the replies of the shards that worked (any order; applied in shard order)."""
        for i in replies:
            self.nexts[i], self.bounds[i] = replies[i][0], replies[i][1]
        for i in sorted(replies):  # source-shard order: every backend delivers in this order
            for dst, (count, earliest, payload) in sorted(replies[i][2].items()):
                self.stats.cross_shard_messages += count
                self.inbox[dst].append(payload)
                if earliest < self.arriving[dst]:
                    self.arriving[dst] = earliest

    def plan(self, observe: bool = False) -> dict[int, tuple[float, list]] | None:
        """The next round's work, ``{shard: (horizon, inbound payloads)}``, or None at the end.

        A shard with no event before its horizon and nothing inbound would do nothing: it is left
        out (every shard works in a round that is ``observe``d). How the work is cut never changes
        results. The work handed out is taken off the state: the caller must run it.
        """
        n = self.n
        pending = [min(a, b) for a, b in zip(self.nexts, self.arriving, strict=True)]
        t_min = min(pending)
        self.stats.virtual_time_ns = t_min
        if t_min == INF:
            return None
        if n == 1:
            horizons = [t_min + self.window_ns if self.observed else INF]
        else:
            horizons = next_horizons(self.done, self.nexts, self.bounds, self.arriving, self.lookahead_ns)
        work = {}
        for i in range(n):
            if observe or self.inbox[i] or pending[i] < horizons[i]:
                work[i] = (horizons[i], self.inbox[i])
                self.inbox[i], self.arriving[i], self.done[i] = [], INF, horizons[i]
        return work


def run_rounds(transport: Transport, lookahead_ns: int, stats: RoundStats, observer: Observer | None = None,
               observe_every_s: float = OBSERVE_EVERY_S, window_ns: float = WINDOW_NS) -> list:  # fmt: skip
    """The rounds of :func:`drive`; ``stats`` is updated as they go (a failed run keeps them)."""
    if getattr(transport, "exchanges_directly", False):
        return _rounds_in_shards(transport, stats, observer, observe_every_s)
    rounds = Rounds(transport.shards, lookahead_ns, window_ns, observer is not None)
    rounds.stats = stats
    rounds.receive(transport.start())
    last_observed = time.monotonic()
    while True:
        due = observer is not None and time.monotonic() - last_observed >= observe_every_s
        work = rounds.plan(observe=due)
        if work is None:
            break
        started = time.perf_counter()
        replies = transport.step({i: (horizon, inbound, due) for i, (horizon, inbound) in work.items()})
        busiest = max(r[4] for r in replies.values())
        stats.overhead_s += time.perf_counter() - started - busiest
        stats.critical_s += busiest
        stats.rounds += 1
        rounds.receive(replies)
        if due:
            last_observed = time.monotonic()
            publish(observer, stats.rounds, stats.cross_shard_messages, stats.virtual_time_ns,
                    [replies[i][3] for i in range(transport.shards)])  # fmt: skip
    finished = transport.finish()
    if observer is not None:
        publish(observer, stats.rounds, stats.cross_shard_messages, stats.virtual_time_ns, [f[2] for f in finished])
    return finished


def _rounds_in_shards(transport, stats: RoundStats, observer: Observer | None, observe_every_s: float) -> list:
    """Rounds that the shards run among themselves (each keeps its own :class:`Rounds`): the driver
    only starts them, hears from them every ``observe_every_s`` wall seconds (or every
    ``UNOBSERVED_EVERY_S``), and finishes them."""
    transport.start()
    while True:
        budget_s = observe_every_s if observer is not None else UNOBSERVED_EVERY_S
        done, counters, shard_stats = transport.advance(budget_s, observer is not None)
        stats.take(counters)
        if done:
            break
        if observer is not None:
            publish(observer, stats.rounds, stats.cross_shard_messages, stats.virtual_time_ns, shard_stats)
    finished = transport.finish()
    if observer is not None:
        publish(observer, stats.rounds, stats.cross_shard_messages, stats.virtual_time_ns, [f[2] for f in finished])
    return finished


def publish(observer: Observer, rounds: int, cross_shard_messages: int, t_min: float, shard_stats: list) -> None:
    """Hand live figures to an observer (shared by every backend)."""
    note = getattr(observer, "note_cross_shard_messages", None)
    if note is not None:
        note(cross_shard_messages)
    observer.update(rounds, t_min, shard_stats)

"""Event kinds of a shard's heap; the kind is also the tie-break priority at equal times.

An event is ``(time_ns, kind, rank, origin, seq, payload)``: every part of the key comes from the
emulated run (never dict order, wall clock or which shard ran first), so the order is total and
the same on every backend.
"""

EV_HANDOVER, EV_STEP, EV_OP_DONE = 0, 1, 2
INF = float("inf")
START = -1  # a program's first run, at time 0 in rank order (Shard.start): before every event


def at_event(exc: BaseException, key: tuple) -> None:
    """Mark a run's error with ``(time_ns, kind, rank)`` of the event whose processing raised it,
    unless an inner handler marked it already: the backends raise, of the errors their shards meet
    in one round, the one with the least key (emulator/engine/coordinator.py, first_error). A rank
    lives on one shard, so the keys of two shards' events differ by ``rank`` at the latest and
    order them as one shard would (origin and seq only break ties within a rank)."""
    if getattr(exc, "event_key", None) is None:
        exc.event_key = key

"""Event kinds of a shard's heap; the kind is also the tie-break priority at equal times.

An event is ``(time_ns, kind, rank, origin, seq, payload)``: every part of the key comes from the
emulated run (never dict order, wall clock or which shard ran first), so the order is total and
the same on every backend.
"""

EV_HANDOVER, EV_STEP, EV_OP_DONE = 0, 1, 2
INF = float("inf")

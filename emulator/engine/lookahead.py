"""How far ahead a shard's neighbours may run: a lower bound on its next cross-shard message.

    emulator run configs/runs/megatron-1t-3072gpu.yaml --shards 4   # rounds: ~1e4 instead of ~2e6

The round protocol (emulator/engine/coordinator.py) lets shard ``j`` process every event stamped
before the earliest time a message from another shard could still reach it. A message leaves a
shard only when one of its ranks starts a send or a step of a collective whose peer lives
elsewhere, so the shard bounds the *start* of its next such operation from what it knows:

- a queued send or collective to another shard (``gpu.cross_queued``) waits for the compute-stream
  work launched before it (CUDA semantics, emulator/engine/ops.py), which runs in order on one
  stream: it starts no earlier than that work's end, and that end is no earlier than the start of
  the stream's running kernel plus the durations of every compute op up to it
  (``Stream.launched_ns`` / ``done_ns`` keep those sums, so the bound is O(1) per op); it also
  waits for the ops queued before it on its own stream, each of which runs at least its least
  duration (a collective: its member's bytes over its own links), e.g. the data-parallel
  all-reduces ahead of the tied-embedding all-reduce at the end of an iteration;
- a rank whose program can still launch: anything it launches later starts after the compute
  stream's last op, hence no earlier than that op's end bound (a finished program launches nothing);
- a collective spanning shards that has started sends at its members' steps, which happen at
  their pending events (steps, hand-overs of their messages) or when a message from another shard
  arrives (the coordinator's part): its bound is the earliest pending event of those members;
- nothing starts before the last horizon reached (``done_until``): every event before it is done.

The bound is kept per destination shard (a queued send knows where it goes; later launches and
collectives under way may go anywhere), so shards that do not exchange messages constrain each
other only through the shards between them.

What a message still to arrive could cause is not in these bounds; the shard gives instead the
least *delay* between an arrival and a send it causes, and the coordinator adds ``arrival +
delay``. Each op records at launch (``Op.dl``, O(1)) the least compute time between a message
arriving and the op ending: a receive or a collective can end as soon as a message arrives (0), a
compute op adds its duration to the least over what it waits for (the previous op on its stream,
the ops it depends on). A queued cross-shard op's ``ds`` (the same at its start), and the
compute stream's last op for later launches, give the shard's delay; a collective under way
spanning shards, or a program that could launch at once, make it 0. Paths from arrivals only
disappear as ops complete, so the figures recorded at launch stay lower bounds.

A block of the compiled engine (emulator/engine/opcore.py) is one op on the compute stream, its
*proxy*, for these sums: its ``a`` is the block's least duration along its compute and tensor
streams, tensor collectives included (:func:`block_bound`, once per template), and its ``dl`` the
least of that after its start and of the ways in through collectives of several arrivals. At the
block's launch the Python rules' bound for the same ops is never tighter (tested): it sums compute
durations only. It learns the collectives' time, and waits, as the block's ops start, which the
proxy does not see; but a folded block's least duration is its exact duration when its ports are
free, and an unfolded one differs by the waits for the group's other members.

Waits on receives and on other streams only delay work, so leaving them out of the bounds keeps
them lower bounds: looser, never wrong. The engine asserts the promise where it matters: a record
stamped before what its destination already processed fails ``Shard.deliver``.
"""

from __future__ import annotations

from emulator.engine.events import INF
from emulator.engine.ops import BLOCK, COLL, COMPUTE


def end_bound(op, stream, now: float) -> float:
    """A lower bound on when ``op`` (on ``stream``, whose ops run in order) completes."""
    if op is None:
        return now
    if op.done:
        return op.t_end if op.t_end > now else now
    head = stream.ops[0]  # the oldest op not completed; ``op`` is it or behind it
    # a compiled block's proxy (opcore.py) lasts at least its least duration (``a``,
    # :func:`block_bound`) from its start, as a compute op its duration
    base = head.t_start if head.started and (head.kind == COMPUTE or head.kind == BLOCK) else now
    # every compute op from the head up to ``op`` still has to run, one after the other
    bound = base + op.cum - stream.done_ns
    return bound if bound > now else now


def bound_queued(shard, queued: list, now: float, to: list[float]) -> None:
    """Lower ``to[j]`` to a lower bound on the start of each op of ``queued`` (not started, in
    launch order) that sends to shard ``j``: its compute dependency's end (:func:`end_bound`), and
    the ops queued before it on its stream, each not started yet running at least its
    :func:`least_duration`, one after the other.

    Along one stream both bounds only grow (later ops depend on later compute and wait behind
    more), so for each destination only the stream's first op to it counts: the walk stops once
    every destination is covered. A program that runs far ahead queues hundreds of collectives on
    one stream; a walk per op, or one to the end, would cost their square each round.
    """
    by_stream: dict[int, list] = {}
    for op in queued:
        by_stream.setdefault(id(op.stream), []).append(op)
    destinations = shard.shards - 1
    for ops in by_stream.values():
        stream = ops[0].stream
        pending = {id(op): op for op in ops}
        covered: set[int] = set()
        total = 0
        for prior in stream.ops:
            op = pending.get(id(prior))
            if op is not None and not covered.issuperset(op.cross):
                dep = op.cdep
                bound = end_bound(dep, dep.stream, now) if dep is not None else now
                if now + total > bound:
                    bound = now + total
                for j in op.cross:
                    covered.add(j)
                    if bound < to[j]:
                        to[j] = bound
                if len(covered) >= destinations:
                    break
            if not prior.started:
                total += least_duration(shard, prior)


def least_duration(shard, op) -> int:
    """A lower bound on how long ``op`` runs once started: a compute op its duration; a
    message-level collective the time its member's bytes need to leave through the member's own
    first links (every byte it sends crosses one of them, each at most at its bandwidth); else 0."""
    if op.kind == COMPUTE:
        return op.a
    if op.kind != COLL:
        return 0
    key = (id(op.a), op.b.name, op.gpu.rank)
    cached = shard.least_durations.get(key)
    if cached is None or cached[0] is not op.a:
        closed = shard.closed_form(op.a, op.b)
        if closed is not None:  # the intra-node fast path: exactly its duration after the last arrival
            least = closed[0]
        else:
            topo, rank = shard.topo, op.gpu.rank
            sent, first_links = 0, set()
            for channel in op.b.segments(op.a, topo):
                for sends, _, repeat in channel:
                    for peer, size, _ in sends:
                        sent += size * repeat
                        first_links.add(topo.route(rank, peer).up[0])
            bandwidth = sum(topo.link_bw[link] for link in first_links)
            least = int(sent // bandwidth) if bandwidth else 0
        cached = shard.least_durations[key] = (op.a, least)
    return cached[1]


def block_bound(steps: list[tuple]) -> tuple[int, float]:
    """``(least_ns, reset_ns)`` of a compiled block (opcore.py) for its proxy on the compute stream:
    ``least_ns`` a lower bound on the time from the block's start to its end (its last compute op's
    end), ``reset_ns`` on the time from an arrival to that end through one of its collectives of
    several arrivals (INF: none). ``steps`` are the block's ops in launch order: ``("c", ns)`` a
    compute op (its duration as launched), ``("m", ns, arrivals, overlapped)`` a closed-form tensor
    collective, ``("w",)`` a wait for the overlapped one (tensor_parallel.launch_prepared).

    Why these are lower bounds: launch_prepared gives the block's ops the dependencies of
    emulator/engine/ops.py, and the walk below takes, for each op, the latest of its predecessors'
    least ends: a compute op starts after the compute op before it and the collectives waited for
    since, and runs its duration; a collective starts after the compute op launched before it and the
    collective before it on the tensor stream (every op of the stream at the block's start belongs to
    an earlier block, all of whose collectives its last compute op waited for), and ends no earlier
    than its duration after its own start (closed form: its duration after the last member's start,
    later ports only later, collective_run.py, opstreams._start). The block's first op starts when its
    proxy starts. By induction over the ops, each op's true start and end, less the block's start,
    are at least the walk's, so the block lasts at least ``least_ns``: ``Op.a`` of the proxy, summed
    into its stream's ``launched_ns`` / ``done_ns`` and ``cum`` as a compute op's duration is
    (:func:`end_bound`), and its ``dl`` is ``delay + least_ns`` (Shard.launch), ``delay`` bounding
    the block's start after an arrival.

    A collective of several arrivals can also end ``ns`` after a message's arrival that started
    another member (Shard.launch's rule for COLL ops: its ``dl`` starts again from ``ns``), so its
    end is a second way in: ``reset_ns`` walks from it alone (everything not after it at minus
    infinity) to the block's end, the least over those collectives, and the proxy's ``dl`` is the
    lesser of the two. A folded collective (one arrival) has no way in but its block's.

    This is at least the Python rules' bound for the same ops, which add each op's duration to the
    *least* over its predecessors (so a compute op after a collective adds to the compute op before
    it, and the collective counts for nothing); here the latest counts, because every predecessor
    must end first: for a folded block ``least_ns`` is its exact duration when its ports are free.
    """
    least = _walk(steps, None)
    reset = INF
    for i, step in enumerate(steps):
        if step[0] == "m" and step[2] > 1:
            after = _walk(steps, i)
            if after < reset:
                reset = after
    return least, reset


def _walk(steps: list[tuple], entry: int | None) -> float:
    """The least end of the block's last compute op after its start (``entry`` None: an int), or
    after an arrival that ends collective ``steps[entry]`` its duration later (INF: no way from
    it to the end), the latest over each op's predecessors."""
    low = 0 if entry is None else -INF
    compute = tp = low  # the least end of the compute stream's last op, of the tensor stream's
    waited = low  # of what the next compute op waits for
    pending = -INF  # of the overlapped collective the next ``"w"`` waits for
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "c":
            compute = (compute if compute > waited else waited) + step[1]
            waited = -INF
        elif kind == "m":
            end = (compute if compute > tp else tp) + step[1]
            if i == entry:
                end = step[1]
            tp = end
            if step[3]:
                pending = end
            elif end > waited:
                waited = end
        elif kind == "w":
            if pending > waited:
                waited = pending
            pending = -INF
    return compute if compute != -INF else INF


def output_bound(shard) -> tuple[list[float], float]:
    """``(to, delay)``: ``to[j]`` bounds the start of the shard's next send to shard ``j`` that no
    new arrival causes; ``delay`` is the least compute time between an arrival and a send it causes.
    """
    now = shard.done_until
    to = [INF] * shard.shards
    every = INF  # what can go anywhere: later launches, collectives under way
    delay = INF
    if shard.cross_runs:
        every, delay = shard.next_time_of(shard.cross_runs), 0
    for gpu in shard.gpus.values():
        if not gpu.finished:
            compute = gpu.streams.get("compute")
            last = compute.last if compute is not None else None
            if last is None or last.done:
                bound, dl = now, 0  # the program may launch a send as soon as it resumes
            else:
                bound, dl = end_bound(last, compute, now), last.dl
            if bound < every:
                every = bound
            if dl < delay:
                delay = dl
        if gpu.cross_queued:
            queued = gpu.cross_queued = [op for op in gpu.cross_queued if not op.started]  # started ones have sent
            for op in queued:
                if op.ds < delay:
                    delay = op.ds
            bound_queued(shard, queued, now, to)
    return [t if t < every else every for t in to], delay

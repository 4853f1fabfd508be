"""A shard's progress figures for live monitoring (emulator/monitoring/live.py gathers them from
every shard about every 0.5 s): O(ranks + links), plain ints and lists only, so that they cross
Ray unchanged. Kept apart from the shard's event loop (emulator/engine/shard.py), as the deadlock
report is (diagnose.py)."""

from __future__ import annotations

import heapq


def live_stats(shard, hot_links: int = 5, recent_iterations: int = 4, slow_ranks: int = 5) -> dict:
    """Progress figures for live monitoring, O(ranks + links): plain ints and lists only.

    Per pipeline stage (``rank // (world / parallel.pipeline)`` for a model run, else one stage
    0): ranks, summed compute / communication / idle ns (idle = a rank's latest op end minus its
    compute time), peak memory, memory in use now (the fullest rank) and the largest share of a
    rank's capacity in use now. ``marks_hist`` is ``[[marks, ranks], ...]``;
    ``iteration_ends_ns`` gives ``[k, end]`` for the shard's last completed iterations (end = the
    latest rank's k-th mark); ``hot_links`` the ``hot_links`` busiest links it owns *in each
    tier* as ``[link, bytes, busy_ns, queued_ns]``; ``tier_queued_ns`` / ``tier_queued_messages``
    the time messages waited for a busy link; ``collective_ns`` ``{kind: [ns, calls]}`` summed
    over members; ``behind`` the unfinished ranks whose latest operation ended earliest and
    ``busiest`` the ranks with the most compute, as ``[rank, ns]``; ``compiling`` whether the
    compiled collective engine is still being loaded or compiled. Faults (emulator/engine/faults.py):
    ``compute_lost_ns`` the compute the GPU faults added (charged minus nominal, all hosted
    ranks), ``stragglers`` the ranks that lost the most as ``[rank, compute ns, lost ns]``,
    ``slow_links`` ``[busy ns, nominal ns]`` per ``faults.slow_link`` entry
    (LinkModel.slow_link_busy).
    """
    from emulator.engine.netcore import kernels_compiling

    topo, stats, core = shard.topo, shard.stats, shard.core
    stats.flush()
    gpus = list(shard.gpus.values())
    stages = shard.settings.pipeline
    stage_size = max(1, topo.world_size // stages)
    ranks, compute, comm, idle, peak, used = ([0] * stages for _ in range(6))
    used_ratio = [0.0] * stages
    marks: dict[int, int] = {}
    finished = ops_done = outstanding = 0
    flops = 0.0
    fold = shard.fold  # a representative counts for its whole folded group
    for g in gpus:
        s = min(g.rank // stage_size, stages - 1)
        ranks[s] += fold
        compute[s] += g.compute_ns * fold
        comm[s] += g.comm_ns * fold
        idle[s] += max(0, g.last_time - g.compute_ns) * fold
        if g.mem_peak > peak[s]:
            peak[s] = g.mem_peak
        if g.mem_used > used[s]:
            used[s] = g.mem_used
        if g.mem_used > used_ratio[s] * g.capacity_bytes:
            used_ratio[s] = g.mem_used / g.capacity_bytes
        n = len(g.marks)
        marks[n] = marks.get(n, 0) + fold
        finished += (g.finished and g.outstanding == 0) * fold
        ops_done += g.ops_done
        outstanding += g.outstanding
        flops += g.flops_done
    done = min(marks, default=0)
    ends = [[k, max([g.marks[k] for g in gpus])] for k in range(max(0, done - recent_iterations), done)]
    running = [g for g in gpus if not (g.finished and g.outstanding == 0)]
    behind = heapq.nsmallest(slow_ranks, running, key=lambda g: (g.last_time, g.rank))
    busiest = heapq.nsmallest(slow_ranks, gpus, key=lambda g: (-g.compute_ns, g.rank))
    lost = [(r, ns) for r, ns in shard.compute_lost_ns.items() if ns > 0]
    stragglers = heapq.nsmallest(slow_ranks, lost, key=lambda pair: (-pair[1], pair[0]))
    busy_ns, queued_ns = stats.link_busy_ns, shard.links.queued_ns
    tiers = len(topo.tier_names)
    tier_busy, tier_queued, tier_waits = [0] * tiers, [0] * tiers, [0] * tiers
    for tier, busy, q, w in zip(topo.link_tier, busy_ns, queued_ns, shard.links.queued_messages, strict=True):
        f = 1 if tier == 0 else fold  # rails are replicated at the end
        tier_busy[tier] += busy * f
        tier_queued[tier] += q * f
        tier_waits[tier] += w * f
    by_tier = getattr(shard, "_live_tier_links", None)
    if by_tier is None:  # the links of each tier, once
        by_tier = shard._live_tier_links = [[] for _ in range(tiers)]
        for link, tier in enumerate(topo.link_tier):
            by_tier[tier].append(link)
    # busiest first, lower link index first among equals
    hot = [i for links in by_tier for i in heapq.nsmallest(hot_links, links, key=lambda i: (-busy_ns[i], i))]
    return {
        "shard": shard.index,
        "events": shard.events,
        "now_ns": shard.now,
        "iterations_done": done,
        "tier_bytes": list(stats.tier_bytes),
        "tier_messages": list(stats.tier_messages),
        "ranks_finished": finished,
        "ranks": len(shard.gpus) * fold,
        "marks_hist": sorted([n, c] for n, c in marks.items()),
        "iteration_ends_ns": ends,
        "tier_busy_ns": tier_busy,
        "tier_queued_ns": tier_queued,
        "tier_queued_messages": tier_waits,
        "tier_size_hist": [sorted([b, c] for b, c in h.items()) for h in stats.size_hist],
        "stage_ranks": ranks,
        "stage_compute_ns": compute,
        "stage_comm_ns": comm,
        "stage_idle_ns": idle,
        "stage_peak_memory_bytes": peak,
        "stage_memory_bytes": used,
        "stage_memory_ratio": used_ratio,
        "hot_links": [[i, stats.link_bytes[i], busy_ns[i], queued_ns[i]] for i in hot if busy_ns[i]],
        "collective_ns": {kind: [ns * fold, n * fold] for kind, (ns, n) in sorted(core.collective_ns.items())},
        "ops_done": ops_done * fold,
        "ops_outstanding": outstanding * fold,
        "flops_done": flops * fold,
        "behind": [[g.rank, g.last_time] for g in behind],
        "busiest": [[g.rank, g.compute_ns] for g in busiest],
        "compiling": kernels_compiling(),
        "compute_lost_ns": sum(shard.compute_lost_ns.values()),
        "stragglers": [[r, shard.gpus[r].compute_ns, lost] for r, lost in stragglers],
        "slow_links": shard.links.slow_link_busy(topo, shard.now, fold) if topo.slow_links else [],
    }

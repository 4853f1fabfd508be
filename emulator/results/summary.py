"""``summary.json``: the core figures of a finished (or stopped) run, from its merged results.

    emulator run configs/examples/ping-pong.yaml --out runs/pp && cat runs/pp/summary.json

Workloads add their figures on top (emulator/workloads/metrics.py); the run sequence
(emulator/runner/sequence.py) adds the status and the jobs.
"""

from __future__ import annotations

import socket

from emulator.engine.faults import applied_faults, stragglers
from emulator.engine.result import RunResult, fingerprint, iteration_times_ns


def histogram_label(bucket: int) -> str:
    """``bucket`` b holds sizes in (2^(b-1), 2^b]: label it by its upper bound."""
    size = 1 << bucket if bucket else 0
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"<={size // scale}{unit}"
    return f"<={size}B"


def summarize(result: RunResult, topo, wall_time_s: float, backend: str, shards: int) -> dict:
    """The core figures of ``summary.json`` (workloads add theirs on top); with faults in the run
    (emulator/engine/faults.py, carried by the topology) also ``faults`` (each entry resolved to ranks and
    links) and ``stragglers`` (the ranks whose compute was slowed and the compute time they lost)."""
    sim_ns = max((r.final_time_ns for r in result.ranks), default=0)
    iters = iteration_times_ns(result)
    names = topo.tier_names
    tier_busy: dict[str, int] = {n: 0 for n in names}
    tier_capacity_links: dict[str, int] = {n: 0 for n in names}
    for link, (_, busy, _, _) in result.links.items():
        tier_busy[names[topo.link_tier[link]]] += busy
    for link in range(len(topo.link_bw)):
        tier_capacity_links[names[topo.link_tier[link]]] += 1
    summary = {
        "name": "",
        "backend": backend,
        "shards": shards,
        "world_size": result.world_size,
        "sim_time_s": sim_ns / 1e9,
        "wall_time_s": wall_time_s,
        "speed_ratio": (sim_ns / 1e9) / wall_time_s if wall_time_s > 0 else None,
        "events": result.events,
        "events_per_s": result.events / wall_time_s if wall_time_s > 0 else None,
        "rounds": result.rounds,
        "cross_shard_messages": result.cross_shard_messages,
        "iterations": len(iters),
        "iteration_time_s": (sum(iters) / len(iters) / 1e9) if iters else None,
        "iteration_times_s": [t / 1e9 for t in iters],
        "bytes_by_tier": {names[t]: b for t, b in enumerate(result.tier_bytes)},
        "messages_by_tier": {names[t]: m for t, m in enumerate(result.tier_messages)},
        "utilisation_by_tier": {
            n: (tier_busy[n] / (tier_capacity_links[n] * sim_ns)) if sim_ns and tier_capacity_links[n] else 0.0
            for n in names
        },
        "message_size_histogram": {
            names[t]: {histogram_label(b): c for b, c in h.items()} for t, h in enumerate(result.size_hist) if h
        },
        "peak_memory_bytes": max((r.peak_memory_bytes for r in result.ranks), default=0),
        "fingerprint": fingerprint(result),
        # wall seconds each shard spent working (the rest of its wall time it waited for rounds)
        "shard_busy_s": [round(b, 3) for b in result.extra.get("shard_busy_s", [])],
        # wall seconds the rounds took beyond their busiest shard's work (calls, batches, driver)
        "round_overhead_s": round(result.extra.get("round_overhead_s", 0.0), 3),
        # where each shard ran: Ray node and host (Ray), or this process
        "shard_nodes": result.extra.get("shard_nodes")
        or [{"node_id": "in-process", "host": socket.gethostname()}] * shards,
    }
    faults = applied_faults(getattr(topo, "faults", None), topo)
    if faults is not None:
        summary["faults"] = faults
        summary["stragglers"] = stragglers(result)
    return summary

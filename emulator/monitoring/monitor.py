"""The run's observer: live figures to the Prometheus exporter and the terminal progress display.

    emulator run configs/examples/data-parallel.yaml --metrics-port 9431 --metrics-grace-s 60

The round protocol calls :meth:`Monitor.update` about every 0.5 s of wall time (see
``emulator.engine.coordinator.Observer``); :meth:`Monitor.finish` sets the final figures and the
status of a completed, failed or interrupted run, :meth:`Monitor.linger` keeps ``/metrics`` up for
the grace period so that Prometheus scrapes them, and :meth:`Monitor.close` stops everything.
Observing never changes results.
"""

from __future__ import annotations

import heapq
import sys
import time
from dataclasses import replace
from typing import TextIO

from emulator.hardware.gpus import get_gpu
from emulator.monitoring.live import NAN, LiveState, Snapshot
from emulator.monitoring.plan import work_plan
from emulator.monitoring.progress import ProgressDisplay
from netmodel.topology import Topology


def expected_iterations(config) -> int | None:
    """``training.iterations`` for a model workload, else ``program_args.iterations``, else None."""
    if getattr(config, "model", None) is not None:
        value = config.training.iterations
    else:
        value = (getattr(config, "program_args", None) or {}).get("iterations")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Monitor:
    """Combines :class:`LiveState`, an optional exporter and a progress display."""

    def __init__(self, config, run_id: str, backend: str = "inline", shards: int = 1, port: int | None = None,
                 host: str = "127.0.0.1", progress: str = "off", stream: TextIO | None = None,
                 topo: Topology | None = None) -> None:  # fmt: skip
        if topo is None:  # the run's own, where the caller has it (emulator.runner.sequence.prepare): built once
            topo = Topology(config.cluster)
        tier_links = [0] * len(topo.tier_names)
        for tier in topo.link_tier:
            tier_links[tier] += 1
        self.topo = topo
        self.state = LiveState(tier_links, expected_iterations(config), work_plan(config, topo),
                               link_tier=topo.link_tier)  # fmt: skip
        self.display = ProgressDisplay(progress, stream)
        self.stream = stream if stream is not None else sys.stderr
        self.snapshot = Snapshot()
        self._cross_shard_messages = 0
        self._start = time.monotonic()
        self.exporter = None
        if port is not None:
            from emulator.monitoring.exporter import Exporter, SnapshotCollector

            info = {"run_id": run_id, "config": config.name, "world_size": str(config.cluster.world_size),
                    "backend": backend, "shards": str(shards)}  # fmt: skip
            compiling = None
            if backend == "inline":  # kernels compile in this process: a scrape can ask while it blocks
                from emulator.engine.netcore import kernels_compiling as compiling
            collector = SnapshotCollector(info, topo.tier_names, tier_links, topo.link_name, topo.link_tier,
                                          _stage_capacity_bytes(config, topo), compiling, topo.slow_links)  # fmt: skip
            self.exporter = Exporter(collector, port, host)
            self.exporter.publish(self.state.observe(0.0, 0, 0, [], 0))

    @property
    def active(self) -> bool:
        """Whether anything consumes live figures (else the run needs no observer)."""
        return self.exporter is not None or self.display.mode != "off"

    def note_cross_shard_messages(self, total: int) -> None:
        self._cross_shard_messages = total

    def update(self, rounds: int, virtual_time_ns: float, shard_stats: list[dict]) -> None:
        wall = time.monotonic() - self._start
        self.snapshot = self.state.observe(wall, rounds, virtual_time_ns, shard_stats, self._cross_shard_messages)
        if self.exporter is not None:
            self.exporter.publish(self.snapshot)
        self.display.show(self.snapshot)

    def finish(self, summary: dict | None = None, result=None) -> None:
        """The run has ended: completed, failed or interrupted (``summary["status"]``; a summary
        without one is a completed run's, no summary nor result a failed run's). Sets the final
        figures from the summary (virtual time, iterations, rounds, MFU, the error line) and, when
        the live figures never saw a link, the busiest links from ``result`` (complete or partial)."""
        self.display.close()
        summary = summary or {}
        status = summary.get("status") or ("completed" if summary or result is not None else "failed")
        snap = replace(self.snapshot, finished=True, status=status, error=summary.get("error") or "")
        if status == "completed":
            snap = replace(snap, eta_s=0.0, iteration_progress=0.0, run_progress=1.0)
        else:  # the run will not go on: no ETA; its progress stays where it stopped
            snap = replace(snap, eta_s=NAN, speed_ratio=NAN)
        virtual_s = summary.get("sim_time_s", summary.get("virtual_time_reached_s"))
        if virtual_s is not None:
            snap = replace(snap, virtual_time_s=virtual_s)
        times = summary.get("iteration_times_s")
        if times is not None:
            snap = replace(snap, iterations_done=len(times), iteration_durations_s=tuple(times))
        for key, field in (("cross_shard_messages", "cross_shard_messages"), ("rounds", "rounds"), ("mfu", "mfu"),
                           ("tokens_per_s", "tokens_per_s")):  # fmt: skip
            if summary.get(key) is not None:
                snap = replace(snap, **{field: summary[key]})
        if result is not None and not snap.hot_links:
            snap = replace(snap, hot_links=self._hot_links(result.links, snap.virtual_time_s))
        self.snapshot = snap
        if self.exporter is not None:
            self.exporter.publish(snap)

    def _hot_links(self, links: dict, virtual_s: float) -> tuple:
        """The busiest links of each tier from merged link statistics (no queueing recorded there)."""
        per_tier: dict[int, list] = {}
        link_tier = self.topo.link_tier
        for link, (nbytes, busy, _, _) in links.items():
            per_tier.setdefault(link_tier[link], []).append((-busy, link, nbytes))
        # the few smallest of each tier without sorting them all (an unfolded 3072-GPU run has
        # tens of thousands of links: a full sort was 2.6% of its whole run); entries are unique
        # by link, so this is ``sorted(entries)[:k]``
        k = self.state.hot_links
        top = sorted(entry for entries in per_tier.values() for entry in heapq.nsmallest(k, entries))
        return tuple((link, nbytes, -busy / 1e9, -busy / 1e9 / virtual_s if virtual_s else 0.0, 0.0)
                     for busy, link, nbytes in top)  # fmt: skip

    def linger(self, grace_s: float, quiet: bool = False) -> None:
        """Keep ``/metrics`` up for ``grace_s`` seconds (Ctrl-C ends the wait early), then close."""
        if self.exporter is not None:
            self.exporter.serve_for(grace_s, quiet, self.stream)
        self.close()

    def close(self) -> None:
        self.display.close()
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None


def _stage_capacity_bytes(config, topo: Topology) -> list[int]:
    """Memory of the smallest GPU of each pipeline stage (one stage for a user program)."""
    stages = max(1, config.parallel.pipeline) if getattr(config, "model", None) is not None else 1
    size = max(1, topo.world_size // stages)
    capacity = [0] * stages
    for rank in range(topo.world_size):
        stage = min(rank // size, stages - 1)
        hbm = get_gpu(topo.gpu_type(rank)).hbm_bytes
        capacity[stage] = hbm if not capacity[stage] else min(capacity[stage], hbm)
    return capacity

"""The run's observer: live figures to the Prometheus exporter and the terminal progress display.

    emulator run configs/examples/data-parallel.yaml --metrics-port 9431 --metrics-grace-s 60

The round protocol calls :meth:`Monitor.update` about every 0.5 s of wall time (see
``emulator.engine.coordinator.Observer``); :meth:`Monitor.finish` sets the final figures from the
run's results, :meth:`Monitor.linger` keeps ``/metrics`` up for the grace period so that Prometheus
scrapes them, and :meth:`Monitor.close` stops everything. Observing never changes results.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from typing import TextIO

from emulator.monitoring.live import LiveState, Snapshot
from emulator.monitoring.progress import ProgressDisplay, format_duration
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
                 host: str = "127.0.0.1", progress: str = "off", stream: TextIO | None = None) -> None:  # fmt: skip
        topo = Topology(config.cluster)
        tier_links = [0] * len(topo.tier_names)
        for tier in topo.link_tier:
            tier_links[tier] += 1
        self.topo = topo
        self.state = LiveState(tier_links, expected_iterations(config))
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
            collector = SnapshotCollector(info, topo.tier_names, tier_links, topo.link_name, topo.link_tier)
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
        """Mark the run finished; exact final figures from the summary and the merged results."""
        self.display.close()
        snap = replace(self.snapshot, finished=True, eta_s=0.0, iteration_progress=0.0, run_progress=1.0)
        if summary is not None:
            times = summary.get("iteration_times_s") or []
            snap = replace(
                snap,
                virtual_time_s=summary["sim_time_s"],
                iterations_done=len(times),
                iteration_durations_s=tuple(times),
                cross_shard_messages=summary.get("cross_shard_messages", snap.cross_shard_messages),
                rounds=summary.get("rounds", snap.rounds),
            )
        if result is not None:
            snap = replace(snap, hot_links=self._hot_links(result.links, snap.virtual_time_s))
        self.snapshot = snap
        if self.exporter is not None:
            self.exporter.publish(snap)

    def _hot_links(self, links: dict, virtual_s: float) -> tuple:
        top = sorted(links.items(), key=lambda kv: (-kv[1][1], kv[0]))[: self.state.hot_links]
        return tuple((link, nbytes, busy / 1e9, busy / 1e9 / virtual_s if virtual_s else 0.0)
                     for link, (nbytes, busy, _, _) in top)  # fmt: skip

    def linger(self, grace_s: float, quiet: bool = False) -> None:
        """Keep ``/metrics`` up for ``grace_s`` seconds (Ctrl-C ends the wait early), then close."""
        if self.exporter is not None and grace_s > 0 and math.isfinite(grace_s):
            if not quiet:
                print(f"metrics stay up at {self.exporter.url} for {format_duration(grace_s)} (Ctrl-C to stop)",
                      file=self.stream, flush=True)  # fmt: skip
            try:
                time.sleep(grace_s)
            except KeyboardInterrupt:
                pass
        self.close()

    def close(self) -> None:
        self.display.close()
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None

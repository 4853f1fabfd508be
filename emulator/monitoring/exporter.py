"""Prometheus exporter of a run's live figures (the only module that imports prometheus_client).

    emulator run configs/examples/data-parallel.yaml --metrics-port 9431 && curl localhost:9431/metrics

:data:`METRICS` is the catalogue of every metric: name, type, labels, help. A custom collector
renders the latest :class:`~emulator.monitoring.live.Snapshot` at each scrape, so values set from
the engine thread are never half-updated. Every series carries ``run`` (the run id), so that the
runs one Prometheus scrapes never mix. Cardinality stays low: other labels are the tier, the
shard, the pipeline stage, the collective kind, at most ``hot_links`` link names per tier, five
ranks per rank list and one series per ``faults.slow_link`` entry - never a pair of GPUs.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from emulator.errors import ConfigError
from emulator.monitoring.live import RUN_STATUSES, Snapshot

DEFAULT_PORT = 9431  # the port deploy/prometheus/prometheus.yml scrapes
RUN_INFO_LABELS = ("run_id", "config", "world_size", "backend", "shards")
RUN_LABEL = "run"  # on every series: the run id
SIZE_BUCKETS_LOG2 = tuple(range(35))  # message-size bucket bounds: powers of 2, 1 B .. 16 GiB (the engine's own)
ITERATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100)

# name -> (type, labels besides ``run``, help); counters are listed without their ``_total`` suffix
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "emulator_run": ("info", RUN_INFO_LABELS, "The run: id (its run directory's name), config, world size, backend"),
    "emulator_run_finished": ("gauge", (), "1 once the run has ended, completed or not (see emulator_run_status)"),
    "emulator_run_status": ("gauge", ("status",), "1 for the run's status: running, completed, failed or interrupted"),
    "emulator_run_error": ("info", ("error",), "Why a failed or interrupted run ended (empty otherwise)"),
    "emulator_kernels_compiling": ("gauge", (), "1 while the compiled collective kernels are being loaded or compiled"),
    "emulator_wall_time_seconds": ("gauge", (), "Wall-clock seconds since the run started"),
    "emulator_virtual_time_seconds": ("gauge", (), "Emulated (virtual) time reached by every shard"),
    "emulator_iterations": ("counter", (), "Training iterations completed by every rank"),
    "emulator_iterations_expected": ("gauge", (), "Iterations the run will do (NaN when unknown)"),
    "emulator_iteration_progress_ratio": ("gauge", (), "Progress of the current iteration, 0 to 1"),
    "emulator_run_progress_ratio": ("gauge", (), "Progress of the whole run, 0 to 1 (NaN when unknown)"),
    "emulator_speed_ratio": ("gauge", (), "Emulation speed: virtual seconds per wall second, last 10 s"),
    "emulator_mean_speed_ratio": ("gauge", (), "Emulation speed since the start: virtual seconds per wall second"),
    "emulator_eta_seconds": ("gauge", (), "Estimated wall seconds to the end of the run (NaN when unknown)"),
    "emulator_mfu_ratio": ("gauge", (), "Model FLOPs utilisation so far: model FLOPs done / (virtual time x peak)"),
    "emulator_tokens_per_second": ("gauge", (), "Training tokens per virtual second so far"),
    "emulator_ranks_finished": ("gauge", (), "Virtual GPUs whose program has finished"),
    "emulator_operations": ("counter", (), "Operations (compute, communication, memory) completed by the ranks"),
    "emulator_queued_operations": ("gauge", (), "Operations launched and not completed yet"),
    "emulator_slowest_rank_virtual_time_seconds": (
        "gauge", ("rank",), "Unfinished ranks furthest behind: virtual end of their latest operation (5)"),
    "emulator_busiest_rank_compute_seconds": ("gauge", ("rank",), "Ranks charged the most compute so far (5)"),
    "emulator_collective_seconds": (
        "counter", ("kind",), "Virtual seconds spent in collectives, per kind, summed over members"),
    "emulator_collective_calls": ("counter", ("kind",), "Collective calls completed per kind, counted per member"),
    "emulator_rounds": ("counter", (), "Synchronisation rounds (slices of virtual time for a single shard)"),
    "emulator_round_duration_seconds": ("gauge", (), "Wall seconds per round, last 10 s"),
    "emulator_cross_shard_messages": ("counter", (), "Messages exchanged between shards"),
    "emulator_shard_events": ("counter", ("shard",), "Events processed per shard"),
    "emulator_shard_virtual_time_seconds": ("gauge", ("shard",), "Virtual time of the last event of each shard"),
    "emulator_tier_bytes": ("counter", ("tier",), "Bytes sent over each network tier"),
    "emulator_tier_messages": ("counter", ("tier",), "Messages sent over each network tier"),
    "emulator_tier_busy_seconds": ("counter", ("tier",), "Virtual seconds of link busy time, over a tier's links"),
    "emulator_tier_queueing_seconds": (
        "counter", ("tier",), "Virtual seconds messages waited for a busy link of the tier"),
    "emulator_tier_queued_messages": ("counter", ("tier",), "Messages that waited for a busy link of the tier"),
    "emulator_tier_links": ("gauge", ("tier",), "Links in each tier (the capacity behind utilisation)"),
    "emulator_tier_utilisation_ratio": ("gauge", ("tier",), "Busy share of a tier's links, last 10 s of wall time"),
    "emulator_tier_mean_utilisation_ratio": ("gauge", ("tier",), "Busy share of a tier's links since the start"),
    "emulator_tier_bandwidth_bytes_per_second": ("gauge", ("tier",), "Bytes per virtual second on a tier, last 10 s"),
    "emulator_message_size_bytes": ("histogram", ("tier",), "Message sizes per tier"),
    "emulator_iteration_duration_seconds": ("histogram", (), "Virtual duration of each completed iteration"),
    "emulator_last_iteration_duration_seconds": ("gauge", (), "Virtual duration of the last completed iteration"),
    "emulator_stage_ranks": ("gauge", ("stage",), "Ranks per pipeline stage"),
    "emulator_stage_compute_seconds": ("gauge", ("stage",), "Virtual seconds of compute, mean over a stage's ranks"),
    "emulator_stage_communication_seconds": (
        "gauge", ("stage",), "Virtual seconds with communication in flight (may overlap compute), mean per rank"),
    "emulator_stage_idle_seconds": (
        "gauge", ("stage",), "Virtual seconds not computing up to a rank's latest operation, mean per rank"),
    "emulator_stage_peak_memory_bytes": ("gauge", ("stage",), "Peak memory of the busiest rank of each stage"),
    "emulator_stage_memory_bytes": ("gauge", ("stage",), "Memory in use now on the fullest rank of each stage"),
    "emulator_stage_memory_ratio": ("gauge", ("stage",), "Memory in use now over capacity, fullest rank of each stage"),
    "emulator_stage_memory_capacity_bytes": ("gauge", ("stage",), "Memory capacity of the smallest GPU of each stage"),
    "emulator_hottest_link_utilisation_ratio": (
        "gauge", ("link", "tier"), "Busy share since the start of the busiest links of each tier"),
    "emulator_hottest_link_bytes": ("gauge", ("link", "tier"), "Bytes through the busiest links of each tier"),
    "emulator_hottest_link_queueing_seconds": (
        "gauge", ("link", "tier"), "Virtual seconds messages waited for the busiest links of each tier"),
    "emulator_fault_compute_lost_seconds": (
        "gauge", (), "Compute the GPU faults added so far, all ranks: charged minus nominal (jitter may subtract)"),
    "emulator_straggler_speed_ratio": (
        "gauge", ("rank",), "Ranks that lost the most compute to faults (5): nominal over charged compute so far"),
    "emulator_straggler_lost_compute_seconds": (
        "gauge", ("rank",), "Ranks that lost the most compute to faults (5): compute seconds lost so far"),
    "emulator_degraded_link_bandwidth_ratio": (
        "gauge", ("fault", "target"), "Bandwidth factor of each faults.slow_link entry (target: tier, NIC or links)"),
    "emulator_degraded_link_active": (
        "gauge", ("fault", "target"), "1 while a faults.slow_link entry's window holds the virtual time, else 0"),
    "emulator_degraded_link_lost_seconds": (
        "gauge", ("fault", "target"), "Busy time of an entry's links beyond what their bytes needed at nominal speed"),
    "emulator_process_cpu_seconds": ("counter", (), "CPU seconds of the emulator's driver process (all threads)"),
    "emulator_process_resident_memory_bytes": ("gauge", (), "Resident memory of the emulator's driver process"),
    "emulator_process_peak_resident_memory_bytes": ("gauge", (), "Peak resident memory of the driver process"),
}  # fmt: skip


def sample_names() -> set[str]:
    """Every series name a scrape can contain (``_total``, ``_bucket``, ``_info`` included)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "info": ("_info",), "histogram": ("_bucket", "_sum", "_count")}
    return {name + sfx for name, (kind, _, _) in METRICS.items() for sfx in suffixes[kind]}


class SnapshotCollector:
    """Renders the latest snapshot; ``snapshot`` is replaced whole (atomic for scraping threads).

    ``compiling`` (optional) is asked at each scrape whether kernels are compiling in this process:
    a compile blocks the engine thread, hence the observer, but not the scrapes."""

    def __init__(self, run_info: dict[str, str], tier_names: list[str], tier_links: list[int], link_names: list[str],
                 link_tiers: list[int], stage_capacity_bytes: list[int] | None = None,
                 compiling: Callable[[], bool] | None = None,
                 slow_links: list[dict] | None = None) -> None:  # fmt: skip
        assert set(run_info) == set(RUN_INFO_LABELS), run_info
        self.run_info = run_info
        self.run = run_info["run_id"]
        self.tier_names = tier_names
        self.tier_links = tier_links
        self.link_names = link_names
        self.link_tiers = link_tiers
        self.stage_capacity_bytes = stage_capacity_bytes or []
        self.compiling = compiling
        # the faults.slow_link entries as applied (Topology.slow_links): target, factor, window
        self.slow_links = slow_links or []
        self.snapshot = Snapshot()

    def _family(self, name: str):
        kind, labels, doc = METRICS[name]
        cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}[kind]
        return cls(name, doc, labels=[RUN_LABEL, *labels])

    def collect(self) -> Iterator:
        snap = self.snapshot
        run = self.run
        tiers, stages = self.tier_names, [str(s) for s in range(len(snap.stage_ranks))]
        shards = [str(s) for s in range(len(snap.shard_events))]
        rss, peak_rss = _memory_bytes()
        compiling = snap.compiling or (not snap.finished and self.compiling is not None and self.compiling())
        values = {
            "emulator_run_finished": float(snap.finished),
            "emulator_kernels_compiling": float(compiling),
            "emulator_wall_time_seconds": snap.wall_s,
            "emulator_virtual_time_seconds": snap.virtual_time_s,
            "emulator_iterations": snap.iterations_done,
            "emulator_iterations_expected": snap.iterations_expected,
            "emulator_iteration_progress_ratio": snap.iteration_progress,
            "emulator_run_progress_ratio": snap.run_progress,
            "emulator_speed_ratio": snap.speed_ratio,
            "emulator_mean_speed_ratio": snap.mean_speed_ratio,
            "emulator_eta_seconds": snap.eta_s,
            "emulator_mfu_ratio": snap.mfu,
            "emulator_tokens_per_second": snap.tokens_per_s,
            "emulator_ranks_finished": snap.ranks_finished,
            "emulator_operations": snap.operations_done,
            "emulator_queued_operations": snap.operations_queued,
            "emulator_rounds": snap.rounds,
            "emulator_round_duration_seconds": snap.round_duration_s,
            "emulator_cross_shard_messages": snap.cross_shard_messages,
            "emulator_last_iteration_duration_seconds": (
                snap.iteration_durations_s[-1] if snap.iteration_durations_s else math.nan
            ),
            "emulator_fault_compute_lost_seconds": snap.compute_lost_s,
            "emulator_process_cpu_seconds": time.process_time(),
            "emulator_process_resident_memory_bytes": rss,
            "emulator_process_peak_resident_memory_bytes": peak_rss,
        }
        labelled = {  # a snapshot without figures yet (no tiers, no shards) exposes no series
            "emulator_run_status": [(s, float(s == snap.status)) for s in RUN_STATUSES],
            "emulator_shard_events": zip(shards, snap.shard_events, strict=False),
            "emulator_shard_virtual_time_seconds": zip(shards, snap.shard_virtual_time_s, strict=False),
            "emulator_tier_bytes": zip(tiers, snap.tier_bytes, strict=False),
            "emulator_tier_messages": zip(tiers, snap.tier_messages, strict=False),
            "emulator_tier_busy_seconds": zip(tiers, snap.tier_busy_s, strict=False),
            "emulator_tier_queueing_seconds": zip(tiers, snap.tier_queueing_s, strict=False),
            "emulator_tier_queued_messages": zip(tiers, snap.tier_queued_messages, strict=False),
            "emulator_tier_links": zip(tiers, self.tier_links, strict=False),
            "emulator_tier_utilisation_ratio": zip(tiers, snap.tier_utilisation, strict=False),
            "emulator_tier_mean_utilisation_ratio": zip(tiers, snap.tier_mean_utilisation, strict=False),
            "emulator_tier_bandwidth_bytes_per_second": zip(tiers, snap.tier_bandwidth_bytes_per_s, strict=False),
            "emulator_stage_ranks": zip(stages, snap.stage_ranks, strict=False),
            "emulator_stage_compute_seconds": zip(stages, snap.stage_compute_s, strict=False),
            "emulator_stage_communication_seconds": zip(stages, snap.stage_comm_s, strict=False),
            "emulator_stage_idle_seconds": zip(stages, snap.stage_idle_s, strict=False),
            "emulator_stage_peak_memory_bytes": zip(stages, snap.stage_peak_memory_bytes, strict=False),
            "emulator_stage_memory_bytes": zip(stages, snap.stage_memory_bytes, strict=False),
            "emulator_stage_memory_ratio": zip(stages, snap.stage_memory_ratio, strict=False),
            "emulator_stage_memory_capacity_bytes": zip(stages, self.stage_capacity_bytes, strict=False),
            "emulator_slowest_rank_virtual_time_seconds": [(str(r), v) for r, v in snap.behind],
            "emulator_busiest_rank_compute_seconds": [(str(r), v) for r, v in snap.busiest],
            "emulator_collective_seconds": [(kind, secs) for kind, secs, _ in snap.collectives],
            "emulator_collective_calls": [(kind, calls) for kind, _, calls in snap.collectives],
            "emulator_straggler_speed_ratio": [(str(r), speed) for r, speed, _ in snap.stragglers],
            "emulator_straggler_lost_compute_seconds": [(str(r), lost) for r, _, lost in snap.stragglers],
        }
        for name, (_, _, doc) in METRICS.items():
            if name == "emulator_run":
                yield InfoMetricFamily(name, doc, value={RUN_LABEL: run, **self.run_info})
            elif name == "emulator_run_error":
                yield InfoMetricFamily(name, doc, value={RUN_LABEL: run, "error": snap.error})
            elif name in values:
                family = self._family(name)
                family.add_metric([run], values[name])
                yield family
            elif name in labelled:
                family = self._family(name)
                for label, value in labelled[name]:
                    family.add_metric([run, label], value)
                yield family
        yield from self._slow_links(snap)
        yield self._message_sizes(snap)
        yield self._iterations(snap)
        for name, index in (("emulator_hottest_link_utilisation_ratio", 3), ("emulator_hottest_link_bytes", 1),
                            ("emulator_hottest_link_queueing_seconds", 4)):  # fmt: skip
            family = self._family(name)
            for link in snap.hot_links:
                family.add_metric([run, self.link_names[link[0]], self.tier_names[self.link_tiers[link[0]]]],
                                  link[index])  # fmt: skip
            yield family

    def _slow_links(self, snap: Snapshot) -> Iterator:
        """Each slow-link entry: its factor, whether its window holds the virtual time now, and
        the busy time it cost its links so far (absent until a shard has reported it)."""
        factor, active, lost = (self._family(name) for name in (
            "emulator_degraded_link_bandwidth_ratio", "emulator_degraded_link_active",
            "emulator_degraded_link_lost_seconds"))  # fmt: skip
        now = snap.virtual_time_s
        for i, entry in enumerate(self.slow_links):
            labels = [self.run, f"slow_link[{i}]", entry["target"]]
            start, end = entry["start_s"], entry["end_s"]
            factor.add_metric(labels, entry["factor"])
            active.add_metric(labels, float((start is None or start <= now) and (end is None or now < end)))
            if i < len(snap.slow_link_lost_s):
                lost.add_metric(labels, snap.slow_link_lost_s[i])
        yield from (factor, active, lost)

    def _message_sizes(self, snap: Snapshot) -> HistogramMetricFamily:
        family = self._family("emulator_message_size_bytes")
        for tier, hist in enumerate(snap.tier_size_hist):
            # size-hist bucket b holds sizes in (2^(b-1), 2^b]: it counts towards every bound >= 2^b
            buckets = [(str(float(1 << b)), sum(c for k, c in hist.items() if k <= b)) for b in SIZE_BUCKETS_LOG2]
            buckets.append(("+Inf", sum(hist.values())))
            family.add_metric([self.run, self.tier_names[tier]], buckets, sum_value=snap.tier_bytes[tier])
        return family

    def _iterations(self, snap: Snapshot) -> HistogramMetricFamily:
        family = self._family("emulator_iteration_duration_seconds")
        durations = snap.iteration_durations_s
        buckets = [(str(b), sum(1 for d in durations if d <= b)) for b in ITERATION_BUCKETS_S]
        family.add_metric([self.run], [*buckets, ("+Inf", len(durations))], sum_value=sum(durations))
        return family


def _memory_bytes() -> tuple[float, float]:
    """Resident and peak resident memory of this process (Linux: /proc; elsewhere the peak twice)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if os.uname().sysname == "Darwin" else 1024  # bytes on macOS, KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), peak
    except OSError:
        return peak, peak


class Exporter:
    """Serves ``/metrics`` on ``host:port`` from its own registry until :meth:`close`."""

    def __init__(self, collector: SnapshotCollector, port: int, host: str = "127.0.0.1") -> None:
        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        try:
            started = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot serve metrics on {host}:{port} ({exc.strerror})") from exc
        # prometheus-client >= 0.20 returns (server, thread); older versions only a daemon thread
        self._server = started[0] if isinstance(started, tuple) else None
        self.url = f"http://{host}:{port}/metrics"

    def publish(self, snapshot: Snapshot) -> None:
        self.collector.snapshot = snapshot

    def serve_for(self, grace_s: float, quiet: bool = False, stream: TextIO | None = None) -> None:
        """Keep serving the final figures ``grace_s`` seconds, so that Prometheus scrapes them (Ctrl-C
        ends the wait early); says so on ``stream`` (stderr) unless ``quiet``."""
        if not (grace_s > 0 and math.isfinite(grace_s)):
            return
        if not quiet:
            from emulator.monitoring.progress import format_duration

            print(f"metrics stay up at {self.url} for {format_duration(grace_s)} (Ctrl-C to stop)",
                  file=stream if stream is not None else sys.stderr, flush=True)  # fmt: skip
        try:
            time.sleep(grace_s)
        except KeyboardInterrupt:
            pass

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

"""Prometheus exporter of a run's live figures (the only module that imports prometheus_client).

    emulator run configs/examples/data-parallel.yaml --metrics-port 9431 && curl localhost:9431/metrics

:data:`METRICS` is the catalogue of every metric: name, type, labels, help. A custom collector
renders the latest :class:`~emulator.monitoring.live.Snapshot` at each scrape, so values set from
the engine thread are never half-updated. Cardinality stays low: labels are the tier, the shard,
the pipeline stage, and at most ``hot_links`` link names - never a pair of GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from emulator.errors import ConfigError
from emulator.monitoring.live import Snapshot

DEFAULT_PORT = 9431  # the port deploy/prometheus/prometheus.yml scrapes
RUN_INFO_LABELS = ("run_id", "config", "world_size", "backend", "shards")
SIZE_BUCKETS_LOG2 = tuple(range(35))  # message-size bucket bounds: powers of 2, 1 B .. 16 GiB (the engine's own)
ITERATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100)

# name -> (type, labels, help); counters are listed without their ``_total`` suffix
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "emulator_run": ("info", RUN_INFO_LABELS, "The run: id (its run directory's name), config, world size, backend"),
    "emulator_run_finished": ("gauge", (), "1 once the run has finished (the endpoint stays up for the grace period)"),
    "emulator_wall_time_seconds": ("gauge", (), "Wall-clock seconds since the run started"),
    "emulator_virtual_time_seconds": ("gauge", (), "Emulated (virtual) time reached by every shard"),
    "emulator_iterations": ("counter", (), "Training iterations completed by every rank"),
    "emulator_iterations_expected": ("gauge", (), "Iterations the run will do (NaN when unknown)"),
    "emulator_iteration_progress_ratio": ("gauge", (), "Progress of the current iteration, 0 to 1"),
    "emulator_run_progress_ratio": ("gauge", (), "Progress of the whole run, 0 to 1 (NaN when unknown)"),
    "emulator_speed_ratio": ("gauge", (), "Emulation speed: virtual seconds per wall second, last 10 s"),
    "emulator_mean_speed_ratio": ("gauge", (), "Emulation speed since the start: virtual seconds per wall second"),
    "emulator_eta_seconds": ("gauge", (), "Estimated wall seconds to the end of the run (NaN when unknown)"),
    "emulator_ranks_finished": ("gauge", (), "Virtual GPUs whose program has finished"),
    "emulator_rounds": ("counter", (), "Synchronisation rounds (slices of virtual time for a single shard)"),
    "emulator_round_duration_seconds": ("gauge", (), "Wall seconds per round, last 10 s"),
    "emulator_cross_shard_messages": ("counter", (), "Messages exchanged between shards"),
    "emulator_shard_events": ("counter", ("shard",), "Events processed per shard"),
    "emulator_shard_virtual_time_seconds": ("gauge", ("shard",), "Virtual time of the last event of each shard"),
    "emulator_tier_bytes": ("counter", ("tier",), "Bytes sent over each network tier"),
    "emulator_tier_messages": ("counter", ("tier",), "Messages sent over each network tier"),
    "emulator_tier_busy_seconds": ("counter", ("tier",), "Virtual seconds of link busy time, over a tier's links"),
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
    "emulator_hottest_link_utilisation_ratio": (
        "gauge", ("link", "tier"), "Busy share of the busiest links since the start (top 10)"),
    "emulator_hottest_link_bytes": ("gauge", ("link", "tier"), "Bytes through the busiest links (top 10)"),
}  # fmt: skip


def sample_names() -> set[str]:
    """Every series name a scrape can contain (``_total``, ``_bucket``, ``_info`` included)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "info": ("_info",), "histogram": ("_bucket", "_sum", "_count")}
    return {name + sfx for name, (kind, _, _) in METRICS.items() for sfx in suffixes[kind]}


class SnapshotCollector:
    """Renders the latest snapshot; ``snapshot`` is replaced whole (atomic for scraping threads)."""

    def __init__(self, run_info: dict[str, str], tier_names: list[str], tier_links: list[int], link_names: list[str],
                 link_tiers: list[int]) -> None:  # fmt: skip
        assert set(run_info) == set(RUN_INFO_LABELS), run_info
        self.run_info = run_info
        self.tier_names = tier_names
        self.tier_links = tier_links
        self.link_names = link_names
        self.link_tiers = link_tiers
        self.snapshot = Snapshot()

    def collect(self) -> Iterator:
        snap = self.snapshot
        tiers, stages = self.tier_names, [str(s) for s in range(len(snap.stage_ranks))]
        shards = [str(s) for s in range(len(snap.shard_events))]
        values = {
            "emulator_run_finished": float(snap.finished),
            "emulator_wall_time_seconds": snap.wall_s,
            "emulator_virtual_time_seconds": snap.virtual_time_s,
            "emulator_iterations": snap.iterations_done,
            "emulator_iterations_expected": snap.iterations_expected,
            "emulator_iteration_progress_ratio": snap.iteration_progress,
            "emulator_run_progress_ratio": snap.run_progress,
            "emulator_speed_ratio": snap.speed_ratio,
            "emulator_mean_speed_ratio": snap.mean_speed_ratio,
            "emulator_eta_seconds": snap.eta_s,
            "emulator_ranks_finished": snap.ranks_finished,
            "emulator_rounds": snap.rounds,
            "emulator_round_duration_seconds": snap.round_duration_s,
            "emulator_cross_shard_messages": snap.cross_shard_messages,
            "emulator_last_iteration_duration_seconds": (
                snap.iteration_durations_s[-1] if snap.iteration_durations_s else math.nan
            ),
        }
        labelled = {  # a snapshot without figures yet (no tiers, no shards) exposes no series
            "emulator_shard_events": zip(shards, snap.shard_events, strict=False),
            "emulator_shard_virtual_time_seconds": zip(shards, snap.shard_virtual_time_s, strict=False),
            "emulator_tier_bytes": zip(tiers, snap.tier_bytes, strict=False),
            "emulator_tier_messages": zip(tiers, snap.tier_messages, strict=False),
            "emulator_tier_busy_seconds": zip(tiers, snap.tier_busy_s, strict=False),
            "emulator_tier_links": zip(tiers, self.tier_links, strict=False),
            "emulator_tier_utilisation_ratio": zip(tiers, snap.tier_utilisation, strict=False),
            "emulator_tier_mean_utilisation_ratio": zip(tiers, snap.tier_mean_utilisation, strict=False),
            "emulator_tier_bandwidth_bytes_per_second": zip(tiers, snap.tier_bandwidth_bytes_per_s, strict=False),
            "emulator_stage_ranks": zip(stages, snap.stage_ranks, strict=False),
            "emulator_stage_compute_seconds": zip(stages, snap.stage_compute_s, strict=False),
            "emulator_stage_communication_seconds": zip(stages, snap.stage_comm_s, strict=False),
            "emulator_stage_idle_seconds": zip(stages, snap.stage_idle_s, strict=False),
            "emulator_stage_peak_memory_bytes": zip(stages, snap.stage_peak_memory_bytes, strict=False),
        }
        for name, (kind, labels, doc) in METRICS.items():
            if kind == "info":
                yield InfoMetricFamily(name, doc, value=self.run_info)
            elif name in values:
                family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                yield family(name, doc, value=values[name])
            elif name in labelled:
                family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=labels)
                for label, value in labelled[name]:
                    family.add_metric([label], value)
                yield family
        yield self._message_sizes(snap)
        yield self._iterations(snap)
        for name, index in (("emulator_hottest_link_utilisation_ratio", 3), ("emulator_hottest_link_bytes", 1)):
            family = GaugeMetricFamily(name, METRICS[name][2], labels=["link", "tier"])
            for link in snap.hot_links:
                family.add_metric([self.link_names[link[0]], self.tier_names[self.link_tiers[link[0]]]], link[index])
            yield family

    def _message_sizes(self, snap: Snapshot) -> HistogramMetricFamily:
        name = "emulator_message_size_bytes"
        family = HistogramMetricFamily(name, METRICS[name][2], labels=["tier"])
        for tier, hist in enumerate(snap.tier_size_hist):
            # size-hist bucket b holds sizes in (2^(b-1), 2^b]: it counts towards every bound >= 2^b
            buckets = [(str(float(1 << b)), sum(c for k, c in hist.items() if k <= b)) for b in SIZE_BUCKETS_LOG2]
            buckets.append(("+Inf", sum(hist.values())))
            family.add_metric([self.tier_names[tier]], buckets, sum_value=snap.tier_bytes[tier])
        return family

    def _iterations(self, snap: Snapshot) -> HistogramMetricFamily:
        name = "emulator_iteration_duration_seconds"
        family = HistogramMetricFamily(name, METRICS[name][2])
        durations = snap.iteration_durations_s
        buckets = [(str(b), sum(1 for d in durations if d <= b)) for b in ITERATION_BUCKETS_S]
        family.add_metric([], [*buckets, ("+Inf", len(durations))], sum_value=sum(durations))
        return family


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

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

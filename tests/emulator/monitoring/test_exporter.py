"""The Prometheus exporter: names, exposition, live progress during a run, port errors."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from emulator.errors import ConfigError
from emulator.monitoring.exporter import METRICS, Exporter, SnapshotCollector, sample_names
from emulator.monitoring.live import Snapshot
from tests.emulator.monitoring.helpers import free_port, scrape, start_emulator, stop, wait_for

COUNTS = {"iterations", "expected", "finished", "rounds", "messages", "events", "links", "ranks", "operations",
          "calls", "status", "compiling", "active"}  # fmt: skip
INFO = {"run_id": "r", "config": "c", "world_size": "16", "backend": "inline", "shards": "2"}
SNAP = Snapshot(
    virtual_time_s=1.5, rounds=7, iterations_done=2, iteration_durations_s=(0.5, 0.5),
    shard_events=(10, 12), shard_virtual_time_s=(1.5, 1.5), tier_bytes=(100, 50), tier_messages=(2, 1),
    tier_busy_s=(0.1, 0.2), tier_utilisation=(0.1, 0.2), tier_mean_utilisation=(0.1, 0.2),
    tier_bandwidth_bytes_per_s=(1.0, 2.0), tier_size_hist=({6: 2}, {5: 1}), stage_ranks=(8, 8),
    stage_compute_s=(1.0, 1.0), stage_comm_s=(0.2, 0.2), stage_idle_s=(0.5, 0.5),
    stage_peak_memory_bytes=(1, 2), hot_links=((0, 100, 0.1, 0.07, 0.01),), stage_memory_bytes=(1, 2),
    stage_memory_ratio=(0.1, 0.2), tier_queueing_s=(0.0, 0.25), tier_queued_messages=(0, 3),
    behind=((3, 1.25),), busiest=((5, 1.0),), collectives=(("all_reduce", 0.5, 4),), mfu=0.4, tokens_per_s=10.0,
    compute_lost_s=0.75, stragglers=((5, 0.5, 0.5), (9, 0.8, 0.25)), slow_link_lost_s=(0.0, 0.125),
)  # fmt: skip
# two faults.slow_link entries as applied (Topology.slow_links): a NIC for a window, a tier all run
SLOW_LINKS = [{"target": "node1.nic0", "links": [3, 4], "factor": 0.25, "start_s": 2.0, "end_s": 3.0},
              {"target": "leaf", "links": [5], "factor": 0.5, "start_s": None, "end_s": None}]  # fmt: skip


def _exposition(snapshot: Snapshot) -> str:
    collector = SnapshotCollector(INFO, ["nvlink", "leaf"], [4, 2], ["node0.gpu0.tx"], [0], [80, 80],
                                  slow_links=SLOW_LINKS)  # fmt: skip
    collector.snapshot = snapshot
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_names_follow_prometheus_conventions():
    """Prefix emulator_, counters end in _total, units are base units, no label per GPU pair."""
    for name, (kind, labels, doc) in METRICS.items():
        assert re.fullmatch(r"emulator_[a-z_]+", name) and doc, name
        assert not name.endswith("_total"), f"{name}: counters are listed without _total"
        assert not re.search(r"_(ms|ns|us|gb|mb|kb|percent)(_|$)", name), name
        assert set(labels) <= {"tier", "shard", "stage", "link", "rank", "kind", "status", "error", "fault",
                               "target", *INFO}, name  # fmt: skip
        assert "run" not in labels, f"{name}: every series gets the run label from the collector"
        unit = name.rsplit("_", 1)[1]
        assert unit in {"seconds", "bytes", "ratio", "second", *COUNTS} or kind == "info", name


def test_exposition_holds_exactly_the_catalogue():
    """Every catalogued series is exposed and nothing else; the histogram buckets are cumulative."""
    text = _exposition(SNAP)
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert exposed == sample_names()
    assert 'emulator_message_size_bytes_bucket{le="64.0",run="r",tier="nvlink"} 2.0' in text
    assert 'emulator_message_size_bytes_bucket{le="32.0",run="r",tier="nvlink"} 0.0' in text
    assert 'emulator_message_size_bytes_sum{run="r",tier="nvlink"} 100.0' in text
    assert 'emulator_hottest_link_utilisation_ratio{link="node0.gpu0.tx",run="r",tier="nvlink"} 0.07' in text
    assert 'emulator_hottest_link_queueing_seconds{link="node0.gpu0.tx",run="r",tier="nvlink"} 0.01' in text
    assert 'emulator_run_info{backend="inline",config="c",run="r",run_id="r",shards="2",world_size="16"} 1.0' in text
    assert 'emulator_tier_queueing_seconds_total{run="r",tier="leaf"} 0.25' in text
    assert 'emulator_slowest_rank_virtual_time_seconds{rank="3",run="r"} 1.25' in text
    assert 'emulator_collective_calls_total{kind="all_reduce",run="r"} 4.0' in text
    assert 'emulator_run_status{run="r",status="running"} 1.0' in text
    assert 'emulator_run_status{run="r",status="failed"} 0.0' in text


def test_fault_figures():
    """Stragglers with their speed and lost compute; each slow-link entry with its factor, whether
    its window holds the virtual time (1.5 s: the NIC's [2, 3) s does not, the whole-run tier's
    does) and the time it cost its links."""
    text = _exposition(SNAP)
    assert 'emulator_fault_compute_lost_seconds{run="r"} 0.75' in text
    assert 'emulator_straggler_speed_ratio{rank="5",run="r"} 0.5' in text
    assert 'emulator_straggler_lost_compute_seconds{rank="9",run="r"} 0.25' in text
    nic, tier = 'fault="slow_link[0]",run="r",target="node1.nic0"', 'fault="slow_link[1]",run="r",target="leaf"'
    assert f"emulator_degraded_link_bandwidth_ratio{{{nic}}} 0.25" in text
    assert f"emulator_degraded_link_active{{{nic}}} 0.0" in text
    assert f"emulator_degraded_link_active{{{tier}}} 1.0" in text
    assert f"emulator_degraded_link_lost_seconds{{{tier}}} 0.125" in text
    later = _exposition(Snapshot(virtual_time_s=2.5, slow_link_lost_s=(0.0, 0.0)))
    assert f"emulator_degraded_link_active{{{nic}}} 1.0" in later
    assert "emulator_straggler_speed_ratio{" not in later  # no straggler, no series


def test_every_series_carries_the_run_label():
    """Two runs scraped by one Prometheus never mix: each sample names its run."""
    for line in _exposition(SNAP).splitlines():
        if line and not line.startswith("#"):
            assert 'run="r"' in line, line


def test_a_failed_run_says_so():
    """Status failed and the error line are exported; the process's own CPU and memory are there."""
    text = _exposition(Snapshot(finished=True, status="failed", error="deadlock: rank 3 waits"))
    assert 'emulator_run_status{run="r",status="failed"} 1.0' in text
    assert 'emulator_run_status{run="r",status="running"} 0.0' in text
    assert 'emulator_run_error_info{error="deadlock: rank 3 waits",run="r"} 1.0' in text
    assert 'emulator_run_finished{run="r"} 1.0' in text
    rss = re.search(r'emulator_process_resident_memory_bytes\{run="r"\} (\S+)', text)
    assert float(rss.group(1)) > 1 << 20


def test_unknown_values_are_nan():
    """Before anything is known, ETA and expected iterations are NaN (not 0)."""
    text = _exposition(Snapshot())
    assert 'emulator_eta_seconds{run="r"} NaN' in text
    assert 'emulator_iterations_expected{run="r"} NaN' in text
    assert 'emulator_mfu_ratio{run="r"} NaN' in text


def test_port_in_use_is_a_user_error():
    """A taken port is reported as a ConfigError naming the flag."""
    port = free_port()
    collector = SnapshotCollector(INFO, [], [], [], [])
    first = Exporter(collector, port)
    try:
        with pytest.raises(ConfigError, match="--metrics-port"):
            Exporter(collector, port)
    finally:
        first.close()


def test_two_scrapes_during_a_run_show_virtual_time_advancing(tmp_path):
    """While the run is in progress, virtual time and events grow between two scrapes."""
    port = free_port()
    proc = start_emulator(port, tmp_path / "run", "--set", "cluster.nodes=2", "--set", "program_args.iterations=4000",
                          "--metrics-grace-s", "0")  # fmt: skip
    try:
        first = wait_for(lambda: (s := scrape(port)) and s["emulator_virtual_time_seconds"] > 0 and s,
                         60, "a first live scrape", proc)  # fmt: skip
        time.sleep(0.6)  # the engine publishes about every 0.5 s of wall time
        second = wait_for(
            lambda: (s := scrape(port)) and s["emulator_virtual_time_seconds"] > first["emulator_virtual_time_seconds"]
            and s, 10, "virtual time to advance", proc,
        )  # fmt: skip
    finally:
        stop(proc)
    assert first["emulator_run_finished"] == 0 and second["emulator_run_finished"] == 0
    assert second["emulator_wall_time_seconds"] > first["emulator_wall_time_seconds"]
    assert second["emulator_iterations_expected"] == 4000
    assert second["emulator_iterations_total"] < 4000

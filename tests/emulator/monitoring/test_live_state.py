"""Live figures: the shards' live stats folded by LiveState agree with the run's final results."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from emulator.backends.inline import run_inline
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.monitoring import LiveState, Monitor, expected_iterations
from emulator.summary import summarize
from netmodel.topology import Topology
from tests.conftest import cluster_dict


def staged_program(gpu):
    """Ranks of the second half hold more memory; every rank computes, all-reduces, marks."""
    block = gpu.alloc((2 if gpu.rank >= gpu.world_size // 2 else 1) << 30, "weights")
    for _ in range(3):
        gpu.compute("forward", flops=2e11)
        gpu.all_reduce(64 << 20)
        gpu.mark_iteration()
    gpu.free(block)


class Recorder:
    """An observer that keeps every observation."""

    def __init__(self):
        self.calls = []
        self.cross = 0

    def note_cross_shard_messages(self, total):
        self.cross = total

    def update(self, rounds, virtual_time_ns, shard_stats):
        self.calls.append((rounds, virtual_time_ns, shard_stats))


def _run(shards, pipeline=1):
    config = from_dict(RunConfig, {"program": "inline:p", "cluster": cluster_dict(nodes=4, gpus=4)}, "")
    if pipeline > 1:  # stage attribution needs a model run; the program stands in for the workload
        config.model = SimpleNamespace()
        config.parallel.pipeline = pipeline
    topo = Topology(config.cluster)
    recorder = Recorder()
    result = run_inline(config, topo, shards, observer=recorder, program=staged_program, args={})
    return config, topo, result, summarize(result, topo, 1.0, "inline", shards), recorder


@pytest.mark.parametrize("shards", [1, 2])
def test_final_snapshot_matches_summary(shards):
    """Bytes, utilisation, iteration times, memory and hottest links equal the merged results."""
    _, topo, result, summary, recorder = _run(shards)
    tier_links = [topo.link_tier.count(t) for t in range(len(topo.tier_names))]
    state = LiveState(tier_links, expected_iterations=3)
    for rounds, t, stats in recorder.calls:
        snap = state.observe(1.0 + rounds, rounds, t, stats, recorder.cross)
    names = topo.tier_names
    assert snap.virtual_time_s == pytest.approx(summary["sim_time_s"])
    assert dict(zip(names, snap.tier_bytes, strict=True)) == summary["bytes_by_tier"]
    for name, util in zip(names, snap.tier_mean_utilisation, strict=True):
        assert util == pytest.approx(summary["utilisation_by_tier"][name])
    assert snap.iterations_done == 3
    assert snap.iteration_durations_s == pytest.approx(summary["iteration_times_s"])
    assert snap.stage_peak_memory_bytes == (summary["peak_memory_bytes"],)
    assert snap.cross_shard_messages == result.cross_shard_messages
    assert (snap.cross_shard_messages > 0) == (shards > 1)
    assert sum(snap.shard_events) == result.events
    hottest = sorted(result.links.items(), key=lambda kv: (-kv[1][1], kv[0]))[:10]
    assert [h[0] for h in snap.hot_links] == [link for link, _ in hottest]
    assert sum(sum(h.values()) for h in snap.tier_size_hist) == sum(result.tier_messages)


def test_stages_follow_megatron_order():
    """With pipeline 2, ranks 0-7 are stage 0 and 8-15 stage 1 (their peak memory differs)."""
    _, _, result, _, recorder = _run(shards=2, pipeline=2)
    state = LiveState([1, 1])
    snap = state.observe(1.0, *recorder.calls[-1][:3])
    assert snap.stage_ranks == (8, 8)
    assert snap.stage_peak_memory_bytes == (1 << 30, 2 << 30)
    computes = [r.compute_ns for r in result.ranks]
    assert snap.stage_compute_s == pytest.approx((sum(computes[:8]) / 8e9, sum(computes[8:]) / 8e9))


def _stats(now_ns, marks, ends):
    return [{"shard": 0, "events": 1, "now_ns": now_ns, "tier_bytes": [0], "tier_messages": [0], "ranks": 4,
             "ranks_finished": 0, "marks_hist": marks, "iteration_ends_ns": ends}]  # fmt: skip


def test_eta_from_mean_iteration_and_recent_speed():
    """1 virtual s per iteration, 1 virtual s per wall s, 10 iterations: at 2 s the ETA is 8 s."""
    state = LiveState([1], expected_iterations=10)
    state.observe(1.0, 1, 1e9, _stats(1e9, [[1, 4]], [[0, 1_000_000_000]]))
    snap = state.observe(2.0, 2, 2e9, _stats(2e9, [[2, 4]], [[0, 1_000_000_000], [1, 2_000_000_000]]))
    assert snap.speed_ratio == pytest.approx(1.0)
    assert snap.eta_s == pytest.approx(8.0)
    assert snap.run_progress == pytest.approx(0.2)
    assert snap.iteration_durations_s == pytest.approx((1.0, 1.0))


def test_eta_unknown_without_expected_iterations():
    """No expected iteration count, or no iteration finished yet: the ETA is NaN."""
    assert math.isnan(LiveState([1]).observe(1.0, 1, 1e9, _stats(1e9, [[1, 4]], [[0, 10**9]])).eta_s)
    first = LiveState([1], expected_iterations=5).observe(1.0, 1, 5e8, _stats(5e8, [[0, 3], [1, 1]], []))
    assert math.isnan(first.eta_s)
    assert first.iteration_progress == pytest.approx(0.25)  # a quarter of the ranks are through it


def test_expected_iterations_from_program_args():
    """program_args.iterations counts for a program run; anything but a positive int is unknown."""
    config = from_dict(RunConfig, {"program": "x.py:f", "program_args": {"iterations": 7}}, "")
    assert expected_iterations(config) == 7
    config.program_args = {"iterations": "many"}
    assert expected_iterations(config) is None


def test_monitor_without_port_or_display_is_inactive():
    """With --quiet and no --metrics-port the run gets no observer at all."""
    config = from_dict(RunConfig, {"program": "x.py:f", "cluster": cluster_dict()}, "")
    assert not Monitor(config, run_id="r").active

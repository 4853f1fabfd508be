"""Live figures: the shards' live stats folded by LiveState agree with the run's final results."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from emulator.backends.inline import InlineTransport, run_inline
from emulator.config.loader import load_run
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.engine.coordinator import drive
from emulator.engine.folding import fold_factor
from emulator.engine.placement import shard_layout
from emulator.engine.settings import EngineSettings
from emulator.engine.shard import Shard
from emulator.monitoring import LiveState, Monitor, expected_iterations
from emulator.monitoring.plan import work_plan
from emulator.results.summary import summarize
from emulator.workloads.metrics import workload_summary
from emulator.workloads.programs import resolve_program
from netmodel.topology import Topology
from tests.conftest import cluster_dict
from tests.emulator.monitoring.helpers import ROOT


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
        config.model = SimpleNamespace(experts=0)  # a dense model stands in
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
    state = LiveState(tier_links, expected_iterations=3, link_tier=topo.link_tier)
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
    per_tier = {}  # the 5 busiest links of each tier, from the merged results
    for link, (_, busy, _, _) in result.links.items():
        per_tier.setdefault(topo.link_tier[link], []).append((-busy, link))
    hottest = sorted(entry for entries in per_tier.values() for entry in sorted(entries)[:5])
    assert [h[0] for h in snap.hot_links] == [link for _, link in hottest]
    assert len({topo.link_tier[h[0]] for h in snap.hot_links}) == len(per_tier) > 1  # InfiniBand shows too
    calls = {kind: n for kind, _, n in snap.collectives}
    assert calls == {"all_reduce": 3 * 16}  # every member's calls
    assert snap.collectives[0][1] > 0
    assert sum(sum(h.values()) for h in snap.tier_size_hist) == sum(result.tier_messages)


def test_fault_figures_match_the_results():
    """Rank 5 at half speed and node 1's NIC 0 at a quarter all run, on 2 shards: the live figures
    name rank 5 (nominal over charged compute 0.5, its lost compute the results'), the compute lost
    in all, and the NIC entry's lost link time (busy minus bytes at nominal bandwidth); an entry
    whose window opens after the run has cost nothing and a windowed GPU fault after it neither."""
    faults = {"slow_gpu": [{"ranks": [5], "factor": 0.5}, {"ranks": [6], "factor": 0.5, "start_s": 100}],
              "slow_link": [{"nic": {"node": 1, "index": 0}, "factor": 0.25},
                            {"tier": "leaf", "factor": 0.5, "start_s": 100}]}  # fmt: skip
    data = {"program": "inline:p", "cluster": cluster_dict(nodes=4, gpus=4), "faults": faults}
    config = from_dict(RunConfig, data, "")
    topo = Topology(config.cluster)
    recorder = Recorder()
    result = run_inline(config, topo, 2, observer=recorder, program=staged_program, args={})
    state = LiveState([topo.link_tier.count(t) for t in range(len(topo.tier_names))], link_tier=topo.link_tier)
    for rounds, t, stats in recorder.calls:
        snap = state.observe(1.0 + rounds, rounds, t, stats, recorder.cross)
    rank5 = result.ranks[5]
    lost_ns = rank5.compute_ns - rank5.nominal_compute_ns
    assert lost_ns > 0 and snap.compute_lost_s == lost_ns / 1e9
    assert snap.stragglers == ((5, pytest.approx(0.5), lost_ns / 1e9),)
    nic = [topo.nic_tx[1][0], topo.nic_rx[1][0]]
    busy = sum(result.links[link][1] for link in nic)
    nominal = sum(result.links[link][0] / (topo.link_bw[link] / 0.25) for link in nic)
    assert busy > 0 and snap.slow_link_lost_s == (pytest.approx((busy - nominal) / 1e9, abs=1e-9), 0.0)
    assert snap.slow_link_lost_s[0] == pytest.approx(0.75 * busy / 1e9, rel=1e-5)  # busy: whole ns per message


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


def final_snapshot(program, nodes: int, both: bool):
    """The live figures at the end of ``program`` on ``nodes`` nodes of 4 GPUs (one shard)."""
    config = from_dict(RunConfig, {"program": "inline:p", "cluster": cluster_dict(nodes=nodes, gpus=4)}, "")
    topo = Topology(config.cluster)
    recorder = Recorder()
    run_inline(config, topo, 1, observer=recorder, program=program, args={"both": both})
    tier_links = [topo.link_tier.count(t) for t in range(len(topo.tier_names))]
    return LiveState(tier_links).observe(1.0, *recorder.calls[-1][:3])


def contending_program(gpu):
    """Two all-reduces over all nodes at once on two streams: the second waits for busy links."""
    if gpu.rank % 4:
        return
    group = gpu.new_group(range(0, gpu.world_size, 4))  # one rank per node: the NICs carry it
    first = gpu.all_reduce(256 << 20, group, async_op=True, stream="a")
    second = gpu.all_reduce(256 << 20, group, async_op=True, stream="b") if gpu.args["both"] else None
    first.wait()
    if second is not None:
        second.wait()


@pytest.mark.parametrize("both", [False, True])
def test_queueing_is_recorded_only_when_links_are_busy(both):
    """A lone collective never waits for a link; two at once do, on the scale-out tier."""
    snap = final_snapshot(contending_program, 4, both)
    assert (sum(snap.tier_queueing_s[1:]) > 0) == both
    assert (sum(snap.tier_queued_messages) > 0) == both
    assert (sum(link[4] for link in snap.hot_links) > 0) == both


def contending_sends(gpu):
    """Rank 0 sends to two ranks of another node at once, on two streams (the same NIC), or once."""
    if gpu.rank == 0:
        first = gpu.send(4, 64 << 20, async_op=True, stream="a")
        second = gpu.send(5, 64 << 20, async_op=True, stream="b") if gpu.args["both"] else None
        first.wait()
        if second is not None:
            second.wait()
    elif gpu.rank == 4 or (gpu.rank == 5 and gpu.args["both"]):
        gpu.recv(0, 64 << 20)


@pytest.mark.parametrize("both", [False, True])
def test_point_to_point_queueing_is_recorded(both):
    """Pipeline-style sends are in the queueing figures too: the second of two sends through one
    NIC waits for it, a lone send never does."""
    snap = final_snapshot(contending_sends, 2, both)
    assert (sum(snap.tier_queued_messages) > 0) == both
    assert (sum(snap.tier_queueing_s) > 0) == both


@pytest.fixture(scope="module")
def model_run():
    """The 8-GPU Megatron 22B run (one iteration), observed at every round."""
    config = load_run(ROOT / "configs" / "runs" / "megatron-22b-8gpu.yaml")
    topo = Topology(config.cluster)
    recorder = Recorder()
    program, args = resolve_program(config)
    settings = EngineSettings.from_run_config(config)
    layout, rank_shard = shard_layout(topo, 1, settings)
    shard = Shard(topo, layout[0], rank_shard, 0, program, settings, args, (), fold_factor(settings, topo), config)
    # observed after every round (10 virtual ms), not every 0.5 s of wall time
    result = drive(InlineTransport([shard], topo.world_size), topo.min_cross_node_latency_ns(), recorder, 0.0)
    summary = summarize(result, topo, 1.0, "inline", 1)
    summary.update(workload_summary(config, result, topo))
    return SimpleNamespace(config=config, topo=topo, recorder=recorder, result=result, summary=summary)


def test_work_plan_is_the_compute_charged(model_run):
    """The plan's compute per iteration is exactly what the ranks were charged."""
    plan = work_plan(model_run.config, model_run.topo)
    final = model_run.recorder.calls[-1][2][0]
    assert list(plan.stage_compute_ns) == final["stage_compute_ns"]


def test_progress_moves_within_one_iteration(model_run):
    """One iteration: progress grows round after round, the ETA is known before the end, and the
    final MFU and tokens/s are the summary's."""
    tiers = len(model_run.topo.tier_names)
    state = LiveState([1] * tiers, 1, work_plan(model_run.config, model_run.topo))
    snaps = [state.observe(1.0 + i, r, t, stats) for i, (r, t, stats) in enumerate(model_run.recorder.calls)]
    progress = [s.run_progress for s in snaps]
    assert progress == sorted(progress) and progress[-1] == pytest.approx(1.0)
    middle = snaps[len(snaps) // 2]
    assert 0 < middle.run_progress < 1 and middle.iteration_progress == middle.run_progress
    assert math.isfinite(middle.eta_s) and middle.eta_s > 0
    assert middle.busiest and middle.behind
    assert snaps[-1].mfu == pytest.approx(model_run.summary["mfu"], rel=1e-3)
    assert snaps[-1].tokens_per_s == pytest.approx(model_run.summary["tokens_per_s"], rel=1e-3)
    assert 0 < max(snaps[-1].stage_memory_ratio) <= 1.0


def test_compile_time_is_not_emulation_speed():
    """The speed window restarts when shards stop compiling: the compile's wall time is not speed,
    and no ETA is drawn from it while they compile."""
    state = LiveState([1], expected_iterations=10)
    stats = _stats(1e9, [[1, 4]], [[0, 1_000_000_000]])
    assert math.isfinite(state.observe(1.0, 1, 1e9, stats).eta_s)
    stats[0]["compiling"] = True
    snap = state.observe(2.0, 2, 1.1e9, stats)
    assert snap.compiling and math.isnan(snap.eta_s)
    stats[0]["compiling"] = False
    state.observe(30.0, 3, 1.2e9, stats)  # the engine waited 28 s for the compile
    snap = state.observe(31.0, 4, 2.2e9, stats)
    assert snap.speed_ratio == pytest.approx(1.0) and not snap.compiling


def test_finish_reports_failed_and_interrupted_runs():
    """finish() takes a failed run's summary (no sim_time_s), a partial result or nothing at all."""
    config = from_dict(RunConfig, {"program": "x.py:f", "cluster": cluster_dict()}, "")
    monitor = Monitor(config, run_id="r")
    monitor.finish({"status": "failed", "error": "deadlock: rank 1 waits", "virtual_time_reached_s": 0.5}, None)
    snap = monitor.snapshot
    assert (snap.finished, snap.status, snap.error) == (True, "failed", "deadlock: rank 1 waits")
    assert snap.virtual_time_s == 0.5 and math.isnan(snap.eta_s)
    monitor = Monitor(config, run_id="r")
    monitor.finish(None, None)
    assert monitor.snapshot.status == "failed"
    monitor = Monitor(config, run_id="r")
    monitor.finish({"status": "interrupted", "error": "interrupted"})
    assert monitor.snapshot.status == "interrupted"
    monitor = Monitor(config, run_id="r")
    monitor.finish({"sim_time_s": 2.0, "iteration_times_s": [1.0, 1.0]})
    snap = monitor.snapshot
    assert (snap.status, snap.run_progress, snap.iterations_done) == ("completed", 1.0, 2)


def test_finish_hot_links_are_each_tiers_busiest():
    """finish() with a result: each tier's ``hot_links`` busiest links (busy time, then link id), in
    that order overall - checked against sorting every link of the tier."""
    config = from_dict(RunConfig, {"program": "x.py:f", "cluster": cluster_dict()}, "")
    monitor = Monitor(config, run_id="r")
    tiers = monitor.topo.link_tier
    # busy times with ties, so that the link id decides
    links = {link: (link * 7, (link * 37) % 11 * 1000, 1, 0) for link in range(len(tiers))}
    monitor.finish({"sim_time_s": 2.0}, SimpleNamespace(links=links))
    k = monitor.state.hot_links
    expected = sorted(
        entry
        for tier in set(tiers)
        for entry in sorted((-busy, link, nbytes) for link, (nbytes, busy, _, _) in links.items()
                            if tiers[link] == tier)[:k]
    )  # fmt: skip
    got = [(link, nbytes, busy_s) for link, nbytes, busy_s, _, _ in monitor.snapshot.hot_links]
    assert got == [(link, nbytes, -busy / 1e9) for busy, link, nbytes in expected]
    assert len(set(tiers)) > 1 and len(got) == k * len(set(tiers))

"""Symmetry folding gives the same results as emulating every rank of a tensor group."""

import pytest

from emulator.config.loader import load_run
from emulator.engine.folding import fold_factor, shift_name
from emulator.engine.settings import EngineSettings
from emulator.runner.sequence import execute
from netmodel.topology import Topology
from tests.conftest import CONFIGS

RUNS = CONFIGS / "runs"
CASES = {
    "pipeline+data, ZeRO-1, spine": (RUNS / "megatron-22b-8gpu.yaml", [
        "cluster.nodes=8", "parallel.pipeline=2", "parallel.data=4", "parallel.zero_stage=1",
        "training.global_batch_size=32", "model.num_layers=4", "cluster.tiers.0.span_nodes=2"]),
    "interleaved, sequence parallel": (RUNS / "megatron-175b-64gpu.yaml", [
        "training.global_batch_size=16", "model.num_layers=48"]),
    "ZeRO-3, full recompute": (RUNS / "megatron-22b-8gpu.yaml", [
        "cluster.nodes=4", "parallel.data=4", "parallel.zero_stage=3", "training.recompute=full",
        "training.global_batch_size=16", "model.num_layers=4"]),
    "heterogeneous, uneven pipeline": (RUNS / "hetero-uneven-pipeline.yaml", ["training.global_batch_size=8"]),
}  # fmt: skip
WALL = {"wall_time_s", "speed_ratio", "events", "events_per_s", "shard_busy_s", "round_overhead_s"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_folded_run_equals_unfolded(case):
    """Every figure, per-rank result, link, histogram, timeline and trace is identical."""
    path, overrides = CASES[case]
    runs = []
    for fold in ("true", "false"):
        config = load_run(path, [*overrides, f"engine.fold_tensor_groups={fold}"])
        runs.append(execute(config, trace_ranks=[0, 5, 9])[:2])
    (a, ra), (b, rb) = runs
    assert {k: v for k, v in a.items() if k not in WALL} == {k: v for k, v in b.items() if k not in WALL}
    assert ra.ranks == rb.ranks and ra.links == rb.links and ra.traces == rb.traces
    assert ra.timeline == rb.timeline and ra.kind_hist == rb.kind_hist and ra.size_hist == rb.size_hist
    assert a["events"] * 4 < b["events"]


def test_folded_and_sharded_equals_unfolded():
    path, overrides = CASES["pipeline+data, ZeRO-1, spine"]
    folded = execute(load_run(path, overrides), shards=4)[0]
    plain = execute(load_run(path, [*overrides, "engine.fold_tensor_groups=false"]), shards=1)[0]
    assert folded["fingerprint"] == plain["fingerprint"]


def test_fold_only_where_exact():
    """Folding needs a tensor group per node and a NIC per GPU, and the built-in workload."""
    config = load_run(RUNS / "megatron-175b-64gpu.yaml")
    assert fold_factor(EngineSettings.from_run_config(config), Topology(config.cluster)) == 8
    unfit = (["parallel.tensor=4", "parallel.data=2"], ["cluster.nic.count=4"], ["engine.fast_collectives=none"],
             ["program=configs/examples/programs.py:ping_pong"])  # fmt: skip
    for overrides in unfit:
        config = load_run(RUNS / "megatron-175b-64gpu.yaml", overrides)
        assert fold_factor(EngineSettings.from_run_config(config), Topology(config.cluster)) == 1, overrides


def test_shift_name_moves_peers_and_representative_groups():
    assert shift_name("send(dst=64, tag=0, 8 B)", 3, 8) == "send(dst=67, tag=0, 8 B)"
    assert (
        shift_name("all_reduce #2 on group[0,64,128] (8 B, ring)", 3, 8)
        == "all_reduce #2 on group[3,67,131] (8 B, ring)"
    )
    assert shift_name("all_gather #1 on group[0,1,2,3,4,5,6,7] (8 B, ring)", 3, 8).endswith(
        "group[0,1,2,3,4,5,6,7] (8 B, ring)"
    )


@pytest.mark.parametrize("algorithm", ["tree", "halving_doubling"])
def test_message_level_scale_up_algorithm_does_not_fold(algorithm):
    """Regression: a tensor collective with a message-level scale-up algorithm needs the group's
    peers, which a folded run does not host; it tripped "folded: no tensor group" (an assertion) on
    either op engine. Such a run now runs unfolded, with the unfolded results."""
    sets = [f"cluster.scale_up.algorithms.all_reduce={algorithm}"]
    config = load_run(RUNS / "megatron-22b-8gpu.yaml", sets)
    assert fold_factor(EngineSettings.from_run_config(config), Topology(config.cluster)) == 1
    plain = execute(load_run(RUNS / "megatron-22b-8gpu.yaml", [*sets, "engine.fold_tensor_groups=false"]))[0]
    assert execute(config)[0]["fingerprint"] == plain["fingerprint"]


_NAME_PIECES = ["send(dst=", "recv(src=", "dst=", "src=", "adst=3", "group[", "]", ",", ",...", "{", "}", "{0}",
                " ", "=", "0", "7", "16", "008", "64", "\u0663", "#2 on ", "group[0,8]", "group[0,8,...]",
                "group[1,2]", "group[08,16]", "group[0,1,2,3,4,5,6,7]"]  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_replicated_traces_are_shift_name_of_every_entry(seed):
    """replicate_traces (names parsed once for every offset, unshifted entries shared) gives each
    offset's trace exactly as shift_name entry by entry: the same names, errors included."""
    import random

    from emulator.engine.folding import replicate_traces

    rng = random.Random(seed)
    for _ in range(3000):
        names = ["".join(rng.choice(_NAME_PIECES) for _ in range(rng.randrange(0, 7))) for _ in range(4)]
        fold = rng.choice([2, 4, 8])
        trace = [(rng.choice(["compute", "comm"]), rng.choice(names), rng.randrange(5), t, t + rng.randrange(3))
                 for t in range(rng.randrange(0, 12))]  # fmt: skip
        if rng.random() < 0.1:
            trace.append(("compute", rng.choice(names), 0, 1, 2, "extra"))  # entries of another length
        offsets = sorted(rng.sample(range(fold), rng.randrange(1, fold + 1)))
        try:
            want = [[(s, shift_name(n, j, fold), *rest) for s, n, *rest in trace] for j in offsets]
        except ValueError:  # "group[1,,2]": shift_name cannot read it, nor can replicate_traces
            with pytest.raises(ValueError):
                replicate_traces(trace, offsets, fold)
            continue
        got = replicate_traces(trace, offsets, fold)
        assert got == want, (names, fold, offsets)
        assert all(type(op) is tuple for replica in got for op in replica)
        if 0 in offsets:
            assert got[offsets.index(0)] is trace  # the representative's own list, as before

"""Faults (emulator/engine/faults.py): validation, exact figures, determinism across shards."""

import csv
import json

import pytest

from emulator.cli import main
from emulator.config.loader import load_cluster, load_run
from emulator.engine.folding import fold_factor
from emulator.engine.settings import EngineSettings
from emulator.errors import ConfigError, FailureError
from emulator.runner.sequence import execute, run_job
from emulator.studies.collbench import collbench
from netmodel.topology import Topology
from tests.conftest import CONFIGS

RUNS = CONFIGS / "runs"
BLOOM = RUNS / "bloom-560m-zero2.yaml"
DATA_PARALLEL = CONFIGS / "examples" / "data-parallel.yaml"
SLOW_RANK_5 = "faults.slow_gpu=[{ranks: [5], factor: 0.5}]"
NIC_QUARTER = "faults.slow_link=[{nic: {node: 1, index: 0}, factor: 0.25}]"


@pytest.mark.parametrize(
    "override, message",
    [
        ("faults.slow_gpu=[{ranks: [32], factor: 0.5}]", "faults.slow_gpu[0].ranks: rank 32 is not in the cluster"),
        ("faults.slow_gpu=[{nodes: [4], factor: 0.5}]", "faults.slow_gpu[0].nodes: node 4 is not in the cluster"),
        ("faults.slow_gpu=[{ranks: [1], factor: 0}]", "faults.slow_gpu[0].factor must be >= 0.01"),
        ("faults.slow_gpu=[{ranks: [1], factor: 1.5}]", "faults.slow_gpu[0].factor must be <= 1"),
        ("faults.slow_gpu=[{factor: 0.5}]", "faults.slow_gpu[0]: give the ranks or the nodes"),
        ("faults.slow_gpu=[{ranks: [1], nodes: [0], factor: 0.5}]", "give ranks or nodes, not both"),
        ("faults.slow_gpu=[{ranks: [1]}]", "missing key 'faults.slow_gpu[0].factor'"),
        ("faults.slow_gpu=[{ranks: [1], factor: 0.5, start_s: 2, end_s: 1}]", "end_s (1) must be after start_s (2)"),
        ("faults.slow_gpu=[{ranks: [1], factor: 0.5, start_s: -1}]", "faults.slow_gpu[0].start_s must be >= 0"),
        ("faults.jitter={sigma: 2}", "faults.jitter.sigma must be <= 1"),
        ("faults.jitter={sigma: 0.1, ranks: [99]}", "faults.jitter.ranks: rank 99 is not in the cluster"),
        (
            "faults.slow_link=[{links: [node9.nic0.tx], factor: 0.5}]",
            "faults.slow_link[0].links: no link 'node9.nic0.tx'",
        ),
        ("faults.slow_link=[{links: [gpu3.nvlink.tx], factor: 0.5}]", "no link 'gpu3.nvlink.tx'"),
        ("faults.slow_link=[{links: [node0.nic8.rx], factor: 0.5}]", "no link 'node0.nic8.rx'"),
        ("faults.slow_link=[{tier: spine, factor: 0.5}]", "faults.slow_link[0].tier: unknown tier 'spine'"),
        ("faults.slow_link=[{nic: {node: 1, index: 8}, factor: 0.5}]", "node 1 has 8 NICs (0..7), got 8"),
        (
            "faults.slow_link=[{tier: ib-spine, factor: 0.5, start_s: 1, end_s: 1}]",
            "faults.slow_link[0]: end_s (1) must be after start_s (1)",
        ),
        ("faults.slow_link=[{tier: ib-spine, factor: 0.5, end_s: 2.0e+9}]", "slow_link[0].end_s must be <= 1000000000"),
        ("faults.slow_link=[{tier: ib-spine, links: [node0.nic0.tx], factor: 0.5}]", "exactly one of links, nic"),
        ("faults.slow_lnk=[]", "did you mean 'slow_link'"),
        ("faults.seed=-1", "faults.seed must be >= 0"),
        ("faults.fail=[{node: 4, at_s: 1}]", "faults.fail[0].node: node 4 is not in the cluster (nodes 0..3)"),
        ("faults.fail=[{at_s: 1}]", "faults.fail[0]: give exactly one of node, link, nic"),
        ("faults.fail=[{node: 1, link: node0.nic0.tx, at_s: 1}]", "exactly one of node, link, nic (got node, link)"),
        ("faults.fail=[{node: 1}]", "missing key 'faults.fail[0].at_s'"),
        ("faults.fail=[{node: 1, at_s: -1}]", "faults.fail[0].at_s must be >= 0"),
        ("faults.fail=[{node: 1, at_s: .inf}]", "faults.fail[0].at_s: expected a finite number"),
        ("faults.fail=[{node: 1, at_s: .nan}]", "faults.fail[0].at_s: expected a finite number"),
        ("faults.fail=[{node: 1, at_s: 2.0e+9}]", "faults.fail[0].at_s must be <= 1000000000"),
        ("faults.fail=[{link: node0.nic9.tx, at_s: 1}]", "faults.fail[0].link: no link 'node0.nic9.tx'"),
        ("faults.fail=[{nic: {node: 1, index: 8}, at_s: 1}]", "faults.fail[0].nic.index: node 1 has 8 NICs"),
        ("faults.fail=[{nic: {node: 7}, at_s: 1}]", "faults.fail[0].nic.node: node 7 is not in the cluster"),
        ("faults.collective_timeout_s=0", "faults.collective_timeout_s must be >= 1e-06"),
        ("faults.collective_timeout_s=.inf", "faults.collective_timeout_s: expected a finite number"),
    ],
)
def test_invalid_faults_name_the_key(override, message):
    with pytest.raises(ConfigError, match=_escaped(message)):
        load_run(BLOOM, [override])


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_set_reaches_every_key():
    config = load_run(BLOOM, ["faults.seed=3", "faults.jitter.sigma=0.05", "faults.jitter.nodes=[1]", SLOW_RANK_5])
    assert config.faults.seed == 3 and config.faults.jitter.sigma == 0.05 and config.faults.jitter.nodes == [1]
    assert config.faults.slow_gpu[0].ranks == [5]


def test_degraded_link_below_the_floor_is_refused():
    """A factor that is valid alone but takes a slow link under the slowest one allowed."""
    overrides = ["cluster.nic.bandwidth_Gbps=0.1", "cluster.nic.efficiency=0.05", "cluster.tiers.0.oversubscription=64",
                 "faults.slow_link=[{tier: ib-spine, factor: 0.5}]"]  # fmt: skip
    config = load_run(BLOOM, overrides)
    with pytest.raises(ConfigError, match=r"faults.slow_link\[0\].factor: 0.5 takes node0.nic0.ib-leaf-ib-spine.up"):
        Topology(config.cluster)


def _iteration_s(summary: dict) -> float:
    return summary["iteration_time_s"]


def test_straggler_costs_a_synchronous_job_its_extra_compute():
    """One GPU at half speed in pure data parallelism: every reduce-scatter and all-gather waits
    for it, so the iteration grows by its extra compute C (1/f - 1), C = its nominal compute per
    iteration, less at most the communication the healthy run exposed (the slow rank's own
    collectives find the others waiting, so they expose no more than before)."""
    base, _, _ = execute(load_run(BLOOM))
    slow, result, _ = execute(load_run(BLOOM, [SLOW_RANK_5]))
    iterations = slow["iterations"]
    rank5 = result.ranks[5]
    compute_per_iteration_ns = rank5.nominal_compute_ns / iterations
    expected_s = compute_per_iteration_ns * (1 / 0.5 - 1) / 1e9
    exposed_s = base["exposed_comm_fraction"] * base["iteration_time_s"]
    delta_s = _iteration_s(slow) - _iteration_s(base)
    assert expected_s - exposed_s <= delta_s <= expected_s
    assert delta_s == pytest.approx(expected_s, rel=2e-4)
    assert slow["stragglers"] == [{"rank": 5, "node": 0, "compute_ns": rank5.compute_ns,
                                   "nominal_compute_ns": rank5.nominal_compute_ns,
                                   "lost_ns": rank5.nominal_compute_ns, "slowdown": 2.0}]  # fmt: skip
    assert slow["faults"]["slow_gpu"] == [{"ranks": [5], "factor": 0.5, "start_s": None, "end_s": None}]
    assert all(r.compute_ns == r.nominal_compute_ns for r in result.ranks if r.rank != 5)


def test_shipped_straggler_example_matches_the_override(tmp_path):
    run = run_job(load_run(RUNS / "bloom-560m-straggler.yaml"), out=tmp_path / "s")
    slowdown = {int(r["rank"]): float(r["compute_slowdown"]) for r in csv.DictReader(open(tmp_path / "s/ranks.csv"))}
    assert slowdown[5] == 2.0 and {v for k, v in slowdown.items() if k != 5} == {1.0}
    assert run.summary["stragglers"][0]["rank"] == 5


def test_window_slows_only_the_kernels_starting_inside_it():
    whole = execute(load_run(BLOOM, [SLOW_RANK_5]))[1].ranks[5]
    windowed = execute(load_run(BLOOM, ["faults.slow_gpu=[{ranks: [5], factor: 0.5, start_s: 1, end_s: 2}]"]))
    rank5 = windowed[1].ranks[5]
    lost = rank5.compute_ns - rank5.nominal_compute_ns
    # the rank computes back to back: the window's second holds ~0.5 s of nominal kernels run at
    # half speed, each losing its nominal length (a kernel started before 1 s runs at full speed)
    assert 0.45e9 < lost < 0.55e9
    assert whole.compute_ns - whole.nominal_compute_ns > 3 * lost
    assert windowed[0]["stragglers"][0]["rank"] == 5


def test_degraded_nic_shows_in_links_and_slows_the_all_reduce(tmp_path):
    """node1.nic0 at 25%: links.csv shows 6 GB/s (24 GB/s HDR x 0.25) and its busy time is 4x;
    the ring all-reduce through it is paced by it, so collbench's busbw drops to a quarter."""
    run_job(load_run(DATA_PARALLEL), out=tmp_path / "a")
    run_job(load_run(DATA_PARALLEL, [NIC_QUARTER]), out=tmp_path / "b")
    links = [{r["name"]: r for r in csv.DictReader(open(tmp_path / d / "links.csv"))} for d in "ab"]
    for direction in ("tx", "rx"):
        healthy, degraded = links[0][f"node1.nic0.{direction}"], links[1][f"node1.nic0.{direction}"]
        assert float(healthy["bandwidth_GBps"]) == 24.0 and float(degraded["bandwidth_GBps"]) == 6.0
        assert healthy["bytes"] == degraded["bytes"]
        assert int(degraded["busy_ns"]) == pytest.approx(4 * int(healthy["busy_ns"]), rel=1e-5)
    assert links[1]["node1.nic1.tx"]["bandwidth_GBps"] == "24.0"
    cluster = load_cluster("dgx-a100-hdr")
    size = [1 << 30]
    (plain,) = collbench(cluster, "all_reduce", 16, None, size)
    (slow,) = collbench(cluster, "all_reduce", 16, None, size, ["node1.nic0=0.25"])
    assert slow["busbw_GBps"] / plain["busbw_GBps"] == pytest.approx(0.25, rel=2e-3)
    assert not getattr(cluster, "faults", None)  # the caller's cluster is left as it was


NIC_WINDOW = "faults.slow_link=[{nic: {node: 1, index: 0}, factor: 0.25, start_s: 0.06, end_s: 0.12}]"


def test_slow_link_window_slows_only_the_iteration_inside_it():
    """node1.nic0 at 25% over [0.06, 0.12) s, the second of three ~0.0588 s iterations: only that
    iteration's all-reduce is slower (none as slow as with the NIC degraded all run), and the
    compiled and the Python collective engines agree bit for bit."""
    base = execute(load_run(DATA_PARALLEL))[0]
    whole = execute(load_run(DATA_PARALLEL, [NIC_QUARTER]))[0]
    runs = [execute(load_run(DATA_PARALLEL, [NIC_WINDOW, f"engine.collective_engine={e}"]))[0]
            for e in ("compiled", "python")]  # fmt: skip
    assert runs[0]["fingerprint"] == runs[1]["fingerprint"] != base["fingerprint"]
    first, second, third = runs[0]["iteration_times_s"]
    assert [first, third] == [base["iteration_times_s"][0], base["iteration_times_s"][2]]
    assert base["iteration_times_s"][1] < second < whole["iteration_times_s"][1]
    assert runs[0]["faults"]["slow_link"] == [
        {"links": ["node1.nic0.tx", "node1.nic0.rx"], "factor": 0.25, "start_s": 0.06, "end_s": 0.12}
    ]


def test_collbench_slow_link_errors():
    cluster = load_cluster("dgx-a100-hdr")
    with pytest.raises(ConfigError, match="expected NAME=FACTOR"):
        collbench(cluster, "all_reduce", 16, None, [1024], ["node1.nic0"])
    with pytest.raises(ConfigError, match="no link 'node1.nic0.tz'"):
        collbench(cluster, "all_reduce", 16, None, [1024], ["node1.nic0.tz=0.5"])
    with pytest.raises(ConfigError, match="factor must be >= 0.01"):
        collbench(cluster, "all_reduce", 16, None, [1024], ["ib-leaf=0"])


EVERY_FAULT = [
    "faults.seed=7",
    "faults.jitter={sigma: 0.1}",
    "faults.slow_gpu=[{ranks: [9], factor: 0.7}, {nodes: [2], factor: 0.8, start_s: 0.02, end_s: 0.1}]",
    "faults.slow_link=[{links: [node0.nic3.tx], factor: 0.3}, {tier: ib-spine, factor: 0.5},"
    " {nic: {node: 1, index: 2}, factor: 0.25, start_s: 0.06, end_s: 0.12}, {links: [gpu3.nvswitch.rx], factor: 0.5,"
    " start_s: 0.01}]",
]


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_faults_are_identical_on_1_2_and_4_shards(engine):
    config = load_run(DATA_PARALLEL, [*EVERY_FAULT, f"engine.collective_engine={engine}",
                                      "cluster.tiers.0.span_nodes=2"])  # fmt: skip
    prints = {execute(config, shards=shards)[0]["fingerprint"] for shards in (1, 2, 4)}
    assert len(prints) == 1


def test_workload_faults_identical_across_shards_and_folding_off():
    """A tensor-parallel run that would fold: with a slow GPU it runs every rank, on any shards."""
    overrides = ["cluster.nodes=4", "parallel.data=4", "training.global_batch_size=16", "model.num_layers=4",
                 "faults.slow_gpu=[{ranks: [3], factor: 0.5}]", "faults.jitter={sigma: 0.05, nodes: [1]}"]  # fmt: skip
    path = RUNS / "megatron-22b-8gpu.yaml"
    config = load_run(path, overrides)
    assert fold_factor(EngineSettings.from_run_config(config), Topology(config.cluster)) == 1
    assert fold_factor(EngineSettings.from_run_config(load_run(path, overrides[:4])), Topology(config.cluster)) == 8
    # a whole tier slows every rail alike: folding stays on, but not for a window on the scale-up
    # tier (one-node groups then run message by message)
    tier = load_run(path, [*overrides[:4], "faults.slow_link=[{tier: ib-leaf, factor: 0.5, start_s: 0}]"])
    assert fold_factor(EngineSettings.from_run_config(tier), Topology(tier.cluster)) == 8
    window = load_run(path, [*overrides[:4], "faults.slow_link=[{tier: nvswitch, factor: 0.5, end_s: 0.1}]"])
    assert fold_factor(EngineSettings.from_run_config(window), Topology(window.cluster)) == 1
    assert execute(window)[0]["iteration_time_s"] > execute(load_run(path, overrides[:4]))[0]["iteration_time_s"]
    prints = {execute(config, shards=shards)[0]["fingerprint"] for shards in (1, 2, 4)}
    assert len(prints) == 1


def test_jitter_is_reproducible_and_seeded():
    def fingerprint(*overrides):
        return execute(load_run(DATA_PARALLEL, list(overrides)))[0]["fingerprint"]

    plain = fingerprint()
    assert fingerprint("faults.jitter={sigma: 0}", "faults.seed=5") == plain
    once = fingerprint("faults.jitter={sigma: 0.05}", "faults.seed=5")
    assert once != plain
    assert fingerprint("faults.jitter={sigma: 0.05}", "faults.seed=5") == once
    assert fingerprint("faults.jitter={sigma: 0.05}", "faults.seed=6") != once


def test_sigma_zero_draws_and_keeps_every_duration():
    """sigma 0 still goes through the draws (factor exp(0) = 1): the charged path, not a skip."""
    from emulator.engine.faults import ComputeFaults

    config = load_run(DATA_PARALLEL, ["faults.jitter={sigma: 0.3}"])
    config.faults.jitter.sigma = 0.0
    assert ComputeFaults.for_faults(config.faults, Topology(config.cluster), range(32)) is None  # inactive
    config.faults.jitter.sigma = 1e-12
    faults = ComputeFaults.for_faults(config.faults, Topology(config.cluster), range(32))
    assert [faults.launch_ns(0, 10**9) for _ in range(3000)] == [10**9] * 3000


def test_uneven_scale_up_ports_take_the_message_level_path():
    """A degraded NVSwitch port: the intra-node fast path would pace and charge every port of the
    group alike (its figures then differ from the reference), so such groups run message by
    message; every rank's times then equal the reference path's (as they do without faults)."""
    overrides = ["cluster.nodes=2", "parallel.data=2", "training.global_batch_size=8", "model.num_layers=2",
                 "faults.slow_link=[{links: [gpu3.nvswitch.tx, gpu3.nvswitch.rx], factor: 0.5}]"]  # fmt: skip
    path = RUNS / "megatron-22b-8gpu.yaml"

    def times(*extra):
        summary, result, _ = execute(load_run(path, [*overrides, *extra]))
        return summary["iteration_time_s"], [(r.final_time_ns, r.comm_ns, r.compute_ns) for r in result.ranks]

    fast, reference = times(), times("engine.fast_collectives=none")
    assert fast == reference
    assert fast[0] > execute(load_run(path, overrides[:4]))[0]["iteration_time_s"]


# -- fail: a node or link that goes down ------------------------------------------------------------
NODE_FAILURE = CONFIGS / "examples" / "node-failure.yaml"
# node 1 dies at 0.1 s, in the second iteration (0.0588 s each) after its first gradient all-reduce
# (call #2) completed; the 24 survivors finish the second half of the backward and start call #3 at
# 0.110318 s, which needs node 1's ranks: PyTorch's watchdog fires 600 s after that start
NODE_FAILURE_LINE = (
    "node 1 failed at t=0.100000 s; the collective timeout (600 s) fires at t=600.110318 s: 24 rank(s) hung "
    "(8 more on the failed node(s)): rank 0 (since t=0.110318 s): all_reduce #3 on group[0,1,2,3,4,5,6,7,...] "
    "(536870912 B, ring) waiting for rank(s) 7, 31 | rank 1 (since t=0.110318 s): all_reduce #3 on "
    "group[0,1,2,3,4,5,6,7,...] (536870912 B, ring) waiting for rank(s) 0, 24"
)


def _failure(config, shards: int = 1) -> FailureError:
    with pytest.raises(FailureError) as info:
        execute(config, shards=shards)
    return info.value


def test_node_failure_stops_at_the_timeout_with_a_partial_run_dir(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(NODE_FAILURE), "--out", str(out), "--quiet"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: " + NODE_FAILURE_LINE + " | ") and line.endswith(" (+20 more ranks)")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == line.removeprefix("error: ")
    # the survivors' last event is the start of the hung call; the run stops 600 s later
    assert summary["virtual_time_reached_s"] == pytest.approx(600.110318466, abs=1e-9)  # the timeout fires
    assert summary["iterations"] == 1 and summary["fingerprint"] and summary["ranks_missing"] == 0
    assert summary["faults"]["fail"] == [{"what": "node 1", "at_s": 0.1, "ranks": list(range(8, 16)),
                                          "links_down": 8 * 2 + 8 * 4}]  # fmt: skip
    for table in ("links.csv", "ranks.csv", "trace.json"):
        assert (out / table).is_file()
    # the failed node's NICs carried nothing after 0.1 s: less than the healthy node 2's
    links = {r["name"]: int(r["bytes"]) for r in csv.DictReader(open(out / "links.csv"))}
    assert links["node1.nic0.tx"] < links["node2.nic0.tx"]


def test_failure_report_and_partial_results_identical_on_1_and_2_shards():
    config = load_run(NODE_FAILURE)
    errors = [_failure(config, shards) for shards in (1, 2)]
    assert str(errors[0]) == str(errors[1]) and str(errors[0]).startswith(NODE_FAILURE_LINE)
    assert errors[0].stop_ns == 600_110_318_466 == errors[1].stop_ns and errors[0].failed_at_ns == 100_000_000
    prints = [e.run_summary["fingerprint"] for e in errors]
    assert prints[0] == prints[1]


def test_timeout_counts_from_the_start_of_the_hung_wait():
    error = _failure(load_run(NODE_FAILURE, ["faults.collective_timeout_s=30"]))
    assert "the collective timeout (30 s) fires at t=30.110318 s: 24 rank(s) hung" in str(error)


def test_failure_after_the_end_or_off_the_path_changes_nothing():
    """After the run's end (0.176 s), or on an uplink share the run never uses (every node of the
    4-node cluster shares one leaf), the figures are those of the healthy run, bit for bit: the
    Python collective path a failure forces gives the compiled core's results."""
    plain = execute(load_run(DATA_PARALLEL))[0]["fingerprint"]
    late = "faults.fail=[{node: 1, at_s: 10}]"
    unused = "faults.fail=[{link: node0.nic0.ib-leaf-ib-spine.up, at_s: 0.01}]"
    for override in (late, unused):
        assert execute(load_run(DATA_PARALLEL, [override]))[0]["fingerprint"] == plain


@pytest.mark.parametrize(
    "override, what",
    [
        ("faults.fail=[{link: node1.nic0.tx, at_s: 0.1}]", "link node1.nic0.tx failed at t=0.100000 s"),
        ("faults.fail=[{nic: {node: 2, index: 3}, at_s: 0.05}]", "NIC 3 of node 2 failed at t=0.050000 s"),
    ],
)
def test_link_failure_hangs_the_ranks_that_need_it(override, what):
    """Every GPU stays up: all 32 ranks hang (none counted on a failed node), the ring all-reduce
    that crosses the link first."""
    errors = [_failure(load_run(DATA_PARALLEL, [override]), shards) for shards in (1, 2)]
    assert str(errors[0]) == str(errors[1])
    text = str(errors[0])
    assert text.startswith(what + "; the collective timeout (600 s) fires at t=600.")
    assert ": 32 rank(s) hung: rank " in text and "all_reduce #" in text


def test_failed_scale_up_port_loses_the_intra_node_closed_form_call():
    """gpu3's NVSwitch port down in a tensor-parallel run: its tensor group's collectives (closed
    form on the fast path, message by message without it) never end; the report names them."""
    overrides = ["cluster.nodes=2", "parallel.data=2", "training.global_batch_size=8", "model.num_layers=2",
                 "faults.fail=[{link: gpu3.nvswitch.tx, at_s: 0.05}]"]  # fmt: skip
    path = RUNS / "megatron-22b-8gpu.yaml"
    for extra in ([], ["engine.fast_collectives=none"]):
        text = str(_failure(load_run(path, [*overrides, *extra])))
        assert text.startswith("link gpu3.nvswitch.tx failed at t=0.050000 s; the collective timeout")
        assert "on group[0,1,2,3,4,5,6,7]" in text

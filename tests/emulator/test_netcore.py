"""The compiled collective engine (emulator/engine/netcore.py) against the Python reference path.

Every observable of a run - each rank's times and counters, every link's bytes, busy time,
messages and queueing, the tier totals, the size histograms, the timeline, the event count, the
cross-shard messages - must
be the same bit for bit with ``engine.collective_engine: compiled`` and ``python``.
"""

import dataclasses

import pytest

from emulator.backends.inline import run_inline
from emulator.config.loader import load_cluster, load_run
from emulator.config.schema import EngineConfig, RunConfig
from emulator.engine.netcore import NetCore, warm_up
from emulator.errors import CollectiveMismatchError, DeadlockError
from emulator.runner.sequence import execute
from emulator.studies.collbench import _bench_program
from netmodel.topology import Topology
from tests.conftest import CONFIGS, cluster_dict


def _observables(result) -> dict:
    """Everything emulated; not ``rounds`` (how the shards synchronised, not what they emulated:
    the core may leave a round earlier or later than the Python path)."""
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return data


def _bench(cluster, engine: str, op: str, algo: str | None, n: int, size: int, shards: int = 1, bucket_us=1000.0):
    config = RunConfig(name="netcore", cluster=cluster, program="collbench:_bench_program",
                       engine=EngineConfig(collective_engine=engine, timeline_bucket_us=bucket_us))  # fmt: skip
    args = {"n": n, "op": op, "algo": algo, "size": size}
    return _observables(run_inline(config, Topology(cluster), shards, program=_bench_program, args=args))


CASES = [
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("all_reduce", "halving_doubling"),
    ("all_reduce", "hierarchical"),
    ("reduce_scatter", "ring"),
    ("reduce_scatter", "halving_doubling"),
    ("all_gather", "ring"),
    ("all_gather", "halving_doubling"),
    ("broadcast", "ring"),
    ("reduce", "ring"),
    ("all_to_all", "pairwise"),
    ("all_to_all", "direct"),
    ("barrier", "dissemination"),
]


@pytest.mark.parametrize(("op", "algo"), CASES)
@pytest.mark.parametrize("n", [12, 32])
def test_every_algorithm_matches_the_reference(op, algo, n):
    """Across nodes (12: a partial node, not a power of two), one and two shards."""
    cluster = load_cluster("dgx-a100-hdr", ["nodes=4"])
    size = 0 if op == "barrier" else (5 << 20) + 3
    for shards in (1, 2):
        reference = _bench(cluster, "python", op, algo, n, size, shards)
        assert reference["events"] > 0
        assert _bench(cluster, "compiled", op, algo, n, size, shards) == reference


def test_oversubscribed_tiers_and_a_fine_timeline_match():
    """Three tiers with 3:1 uplinks (queueing on shared links) and 5 us timeline buckets: more
    buckets than the core's first timeline array holds, so its overflow path is used too."""
    cluster = load_cluster("commodity-pcie-ethernet", [])
    world = Topology(cluster).world_size
    reference = _bench(cluster, "python", "all_reduce", "ring", world, 256 << 20, bucket_us=5.0)
    assert max(max(line, default=0) for line in reference["timeline"]) > 1024
    assert _bench(cluster, "compiled", "all_reduce", "ring", world, 256 << 20, bucket_us=5.0) == reference


def test_signatures_beyond_62_bits_match():
    """A 64 GiB all-reduce: its signature (size << 28) needs more than one int64."""
    cluster = load_cluster("dgx-a100-hdr", ["nodes=2"])
    reference = _bench(cluster, "python", "all_reduce", "ring", 16, 64 << 30)
    assert _bench(cluster, "compiled", "all_reduce", "ring", 16, 64 << 30) == reference


def test_training_workload_matches_on_two_shards():
    """The built-in workload (pipeline sends in Python, data-parallel rings in the core, sharing links)."""
    results = []
    for engine in ("python", "compiled"):
        config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", [f"engine.collective_engine={engine}"])
        summary, result, _ = execute(config, shards=2)
        results.append((summary["fingerprint"], _observables(result)))
    assert results[0] == results[1]


@pytest.mark.parametrize(("example", "error"), [("mismatch", CollectiveMismatchError), ("deadlock", DeadlockError)])
def test_bug_reports_are_the_reference_ones(example, error):
    messages = []
    for engine in ("python", "compiled"):
        config = load_run(CONFIGS / "examples" / f"{example}.yaml", [f"engine.collective_engine={engine}"])
        with pytest.raises(error) as info:
            execute(config)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_cross_node_mismatch_is_found_by_the_core():
    """Members of a multi-node group call different collectives: the core reports the first
    message whose signature differs, with both calls, like the reference path."""

    def program(gpu):
        if gpu.rank == 9:
            gpu.all_gather(1 << 20)
        else:
            gpu.all_reduce(1 << 20)

    cluster = load_cluster("dgx-a100-hdr", ["nodes=2"])
    messages = []
    for engine in ("python", "compiled"):
        engine_config = EngineConfig(collective_engine=engine)
        config = RunConfig(name="mismatch", cluster=cluster, program="x:y", engine=engine_config)
        with pytest.raises(CollectiveMismatchError) as info:
            run_inline(config, Topology(cluster), program=program, args={})
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "rank 9" in messages[0] and "all_gather" in messages[0] and "all_reduce" in messages[0]


def test_growth_from_tiny_arrays_changes_nothing(monkeypatch):
    """Every array of the core starts at one or two rows: each grows (heap, messages, hash table
    rehashed, tables, routes, outbox, timeline with its overflow rows) and the results stay the
    reference ones."""
    cluster = load_cluster("dgx-a100-hdr", ["nodes=4"])
    reference = [_bench(cluster, "python", op, algo, 32, (3 << 20) + 1, 2, bucket_us=2.0)
                 for op, algo in (("all_reduce", "ring"), ("all_to_all", "direct"))]  # fmt: skip
    tiny = {name: 2 for name in NetCore.INITIAL}
    monkeypatch.setattr(NetCore, "INITIAL", tiny)
    compiled = [_bench(cluster, "compiled", op, algo, 32, (3 << 20) + 1, 2, bucket_us=2.0)
                for op, algo in (("all_reduce", "ring"), ("all_to_all", "direct"))]  # fmt: skip
    assert compiled == reference


def test_warm_up_loads_the_kernels():
    warm_up()  # compiles or loads each kernel once; a broken signature fails here, not mid-run



def test_slow_links_with_zero_byte_timeline_shares_match():
    """A 0.5 Gb/s NIC (under 1 byte per ns) and 1 us buckets: some buckets a message spans get a
    zero share of its bytes; neither path records them."""
    cluster = load_cluster("dgx-a100-hdr", ["nodes=2", "nic.bandwidth_Gbps=1", "nic.efficiency=0.5"])

    def program(gpu):
        for i in range(50):
            gpu.compute(flops=1e9 * ((i * 7919 + gpu.rank) % 13))
            gpu.all_reduce(32, algo="ring")

    results = []
    for engine in ("python", "compiled"):
        config = RunConfig(name="slow", cluster=cluster, program="x:y",
                           engine=EngineConfig(collective_engine=engine, timeline_bucket_us=1.0))  # fmt: skip
        results.append(_observables(run_inline(config, Topology(cluster), program=program, args={})))
    assert results[0] == results[1]
    assert all(v > 0 for line in results[0]["timeline"] for v in line.values())


def test_virtual_time_beyond_the_engine_range_is_an_error(run):
    """A collective that starts past 2^62 ns (4097 kernels of the longest duration the GPU API
    allows before it): a clear error from the compiled core, not a wrapped int64. Sizes cannot get
    there any more: the API refuses a buffer larger than the GPU's memory."""
    from emulator.engine.api import MAX_OP_NS
    from emulator.errors import EmulatorError

    def program(gpu):
        for _ in range(4097):
            gpu.compute("long", duration_ns=MAX_OP_NS)
        gpu.all_reduce(1 << 20, algo="ring")

    with pytest.raises(EmulatorError, match="over 2\\^62 ns"):
        run(program, cluster_dict(nodes=2), fast="none", engine={"collective_engine": "compiled"})


def test_link_model_rules_agree_with_the_kernels():
    """netmodel/links.py's transfer rule and the kernels' copy give the same end time bit for bit,
    over random windows (overlapping, open-ended, sub-ns rates), link sets, sizes and starts; and
    no end is earlier than at the whole-run bandwidth (the lookahead's lower bounds rely on it)."""
    import random

    import numpy as np

    from emulator.engine.netkernels import _finish
    from netmodel.links import LinkModel

    rng = random.Random(5)
    topo = Topology(load_cluster("dgx-a100-hdr", ["nodes=2"]))
    n = len(topo.link_bw)
    topo.link_windows = {
        link: [(start, start + rng.choice([1, 10**3, 10**6, 10**9, 1 << 62]), rng.choice([0.01, 0.3, 0.5, 0.97]))
               for start in sorted(rng.randrange(0, 10**7) for _ in range(rng.randint(1, 3)))]
        for link in rng.sample(range(n), n // 3)
    }  # fmt: skip
    model = LinkModel(topo)
    bw, _, ptr, ns, factor = model.arrays()
    checked = 0
    for _ in range(3000):
        links = rng.sample(range(n), rng.randint(1, 3))
        size = rng.choice([0, 1, 3, 1 << 10, 1 << 20, 1 << 30, rng.randrange(1 << 34)])
        start = rng.randrange(0, 2 * 10**7)
        expected = model.finish_ns(links, size, start)
        assert _finish(bw, ptr, ns, factor, np.array(links, np.int64), size, start) == expected, (links, size, start)
        assert expected >= start + int(-(-size // min(topo.link_bw[link] for link in links)))
        checked += any(link in topo.link_windows for link in links)
    assert checked > 1000

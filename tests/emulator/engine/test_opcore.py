"""The compiled per-op engine (emulator/engine/opcore.py) against the Python rules it compiles.

Fuzzed built-in workload runs (tensor, pipeline and schedule, sequence parallelism, recomputation,
how far programs run ahead - small values suspend a program in the middle of a block -, timeline
buckets shorter than a collective, folding on and off, faults, ZeRO, experts, context parallelism)
run under ``engine.op_engine: python`` and ``compiled``; every result, traces included, must be
equal bit for bit. The shipped run files' pins (tests/test_shipped_runs.py) run the compiled engine
(the default) against fingerprints recorded with the Python rules.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from emulator.config.loader import load_run
from emulator.engine import opcore
from emulator.engine.stats import ShardStats
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS

BASES = ["megatron-22b-8gpu", "megatron-175b-64gpu", "llama3-8b-64gpu", "bloom-560m-zero2"]
# (key, values) a fuzzed case draws from; a combination the config rejects is drawn again
AXES = [
    ("parallel.tensor", [1, 2, 4, 8]),
    ("parallel.pipeline", [1, 2, 4]),
    ("parallel.virtual_stages", [1, 2]),
    ("parallel.schedule", ["1f1b", "gpipe"]),
    ("parallel.sequence_parallel", ["true", "false"]),
    ("training.recompute", ["none", "selective", "full"]),
    ("training.micro_batch_size", [1, 2]),
    ("training.iterations", [1, 2]),
    ("engine.max_ops_ahead", [2, 5, 16, 256]),
    ("engine.timeline_bucket_us", [1000.0, 37.5, 3.0]),
    ("engine.fold_tensor_groups", ["true", "false"]),
    ("engine.fast_collectives", ["intra_node", "none"]),
]


def _observables(result) -> dict:
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return data


def _run(name: str, overrides: list[str], engine: str, trace_ranks=(), shards: int = 1):
    path = CONFIGS / name if name.endswith(".yaml") else CONFIGS / "runs" / f"{name}.yaml"
    config = load_run(path, [*overrides, f"engine.op_engine={engine}"])
    try:
        summary, result, _ = execute(config, shards=shards, trace_ranks=trace_ranks)
    except EmulatorError as exc:  # an OOM or a hang is a result too: both paths must report it alike
        return type(exc).__name__, str(exc)
    return summary["fingerprint"], _observables(result)


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    made = 0
    while made < count:
        base = rng.choice(BASES)
        overrides = [f"{key}={rng.choice(values)}" for key, values in rng.sample(AXES, 5)]
        pipeline = 1
        for o in overrides:
            if o.startswith("parallel.pipeline="):
                pipeline = int(o.split("=")[1])
        overrides.append(f"training.global_batch_size={4 * pipeline * rng.choice([1, 2])}")
        try:
            load_run(CONFIGS / "runs" / f"{base}.yaml", overrides)
        except (ConfigError, EmulatorError):
            continue
        made += 1
        yield base, overrides


@pytest.fixture
def counted(monkeypatch):
    """How many blocks the compiled engine took (so that a case that never uses it is seen)."""
    taken = [0]
    launch = opcore.OpCore.launch

    def counting(self, gpu, block, memory=None):
        done = launch(self, gpu, block, memory)
        taken[0] += done
        return done

    monkeypatch.setattr(opcore.OpCore, "launch", counting)
    return taken


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_workloads_match_the_python_rules(seed, counted):
    compiled_cases = 0
    for base, overrides in _cases(seed, 4):
        before = counted[0]
        compiled = _run(base, overrides, "compiled")
        took = counted[0] > before
        reference = _run(base, overrides, "python")
        assert compiled == reference, (base, overrides)
        compiled_cases += took
    assert compiled_cases, "no case ran the compiled engine"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 15))
def test_more_fuzzed_workloads_match_the_python_rules(seed, counted):
    for base, overrides in _cases(seed, 4):
        assert _run(base, overrides, "compiled") == _run(base, overrides, "python"), (base, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # folded tensor groups, 1F1B, full recomputation
        ["engine.max_ops_ahead=3", "engine.timeline_bucket_us=50"],  # suspended mid-block; spread buckets
        ["training.recompute=none", "parallel.schedule=gpipe"],
    ],
)
def test_shortened_reference_run_matches(overrides, counted):
    """The 3072-GPU reference run with 2 microbatches per pipeline (its shape, 256 times shorter);
    the first node traced (its representative runs the Python rules beside compiled ones)."""
    args = ["training.global_batch_size=12", *overrides]
    compiled = _run("megatron-1t-3072gpu", args, "compiled", trace_ranks=range(8))
    assert counted[0] > 0
    assert compiled == _run("megatron-1t-3072gpu", args, "python", trace_ranks=range(8))


@pytest.mark.parametrize("shards", [2, 3])
def test_several_shards_match(shards, counted):
    """The kernels on several in-process shards (the lookahead bounds a block by its proxy): the
    Python rules' results, and one shard's fingerprint."""
    args = ["training.global_batch_size=12"]
    compiled = _run("megatron-1t-3072gpu", args, "compiled", shards=shards)
    assert counted[0] > 0
    assert compiled == _run("megatron-1t-3072gpu", args, "python", shards=shards)
    assert compiled[0] == _run("megatron-1t-3072gpu", args, "compiled")[0]  # the fingerprint


def test_a_straggler_takes_the_kernels_and_jitter_the_python_rules(counted):
    """A whole-run straggler (its kernels' durations as launched fixed: the templates take them,
    tensor groups unfolded) runs the compiled engine, jitter (a draw per kernel) does not; the
    results are the same either way."""
    args = ["training.global_batch_size=8", "faults.slow_gpu=[{ranks: [1], factor: 0.5}]"]
    compiled = _run("megatron-175b-64gpu", args, "compiled")
    assert counted[0] > 0
    assert compiled == _run("megatron-175b-64gpu", args, "python")
    counted[0] = 0
    args = ["training.global_batch_size=8", "faults.jitter={sigma: 0.05}"]
    compiled = _run("megatron-175b-64gpu", args, "compiled")
    assert counted[0] == 0
    assert compiled == _run("megatron-175b-64gpu", args, "python")


@pytest.mark.parametrize("example", sorted(p.name for p in (CONFIGS / "examples").glob("*.yaml")))
def test_user_programs_match(example, counted):
    """User programs (configs/examples: deadlock, mismatch, OOM and node failure reports included)
    never take the kernels, and give the same results, or the same error, under both settings."""
    compiled = _run(f"examples/{example}", [], "compiled")
    assert counted[0] == 0
    assert compiled == _run(f"examples/{example}", [], "python")


def test_timeline_rule_equals_the_shards():
    """opstreams._timeline, numba's copy of ShardStats.timeline_add for tier 0, on fuzzed transfers."""
    import numpy as np

    from emulator.config.loader import load_cluster
    from emulator.engine import opkernels as k
    from netmodel.topology import Topology

    topo = Topology(load_cluster("dgx-a100-hdr", ["nodes=1"]))
    rng = random.Random(7)
    for bucket in (1000, 37, 1_000_000):
        stats = ShardStats(topo, bucket)
        tl = np.zeros(4096, np.int64)
        ovf = np.zeros((4096, 4), np.int64)
        g = np.zeros(k.G_FIELDS, np.int64)
        g[k.G_BUCKET] = bucket
        for _ in range(2000):
            # sizes whose sums stay inside int64 (exabytes per bucket), and a product past it (to Python)
            size = rng.choice([0, 1, 7, 4096, 104857600, rng.randrange(1 << 34), 1 << 61])
            count = rng.choice([1, 3, 8, 127])
            t = rng.randrange(0, 3_000_000)
            t_end = t + rng.choice([0, 1, bucket - 1, bucket, 3 * bucket + 1, rng.randrange(10**6)])
            stats.timeline_add(0, size, count, t, t_end)
            k._timeline(tl, ovf, g, size, count, t, t_end)
        line: dict[int, int] = {}
        for size, count, t, t_end in ovf[: g[k.G_NOVF]].tolist():  # what the shard adds in Python
            ShardStats.timeline_add(_Line(line, bucket), 0, size, count, t, t_end)
        for slot in np.flatnonzero(tl).tolist():
            line[slot] = line.get(slot, 0) + int(tl[slot])
        assert line == stats.timeline[0]
        assert g[k.G_NOVF] > 0  # the products past int64 went to Python


class _Line:
    """A stand-in ShardStats with one tier's timeline (for ShardStats.timeline_add)."""

    def __init__(self, line: dict, bucket_ns: int):
        self.timeline = [line]
        self.bucket_ns = bucket_ns


def test_warm_up_loads_the_kernels():
    opcore.warm_up()

"""Fuzzing the compiled engine's blocks after two changes that interact (issue 24): a block's
proxy bounds the lookahead by the block's least duration (lookahead.block_bound, Shard.launch's
BLOCK rule), which must stay a lower bound, and blocks carry allocs and frees (opkernels' memory
rows: ST_IRESUME, ST_IBLOCK, ST_OOM). Small clusters drawn over the axes both depend on - tensor,
pipeline and data sizes, schedules, recomputation, micro and global batches, ``max_ops_ahead``,
folding, slow GPUs and links, ZeRO stages, overlap flags, activations near the GPU's memory - run
under ``engine.op_engine: compiled`` and ``python`` on 1, 2, 3 and 4 in-process shards; the whole
run directories (or the error lines) must be the same (test_opcore_fuzz.assert_same_run_dirs). A
proxy's bound that is not a lower bound fails Shard.deliver's assertion on several shards; each
compiled block's duration is also checked against its proxy's least duration directly.

What the fuzzing found is below, reduced, marked xfail(strict=True): none in the compiled engine
(every finished run matched; every block lasted at least its bound), two of the multi-shard
protocol, which both engines share: a failed run's partial results depend on the round
boundaries, and errors met in one round were raised in shard order rather than in virtual-time
order (fixed: coordinator.first_error). (A third, interleaving with pipeline 1 passing the
config, is fixed: tests/emulator/test_config.py.)
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from pathlib import Path

import pytest

from emulator.config.loader import load_run
from emulator.engine import opkernels as k
from emulator.engine.opcore import OpCore
from emulator.errors import EmulatorError
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import run_dir

BASE = CONFIGS / "runs" / "megatron-22b-8gpu.yaml"  # 8 A100s on a node, TP 8: shrunk and reshaped below

# (key, values): a case draws several; one value may set several keys (";" between them)
AXES = [
    ("shape", ["parallel.tensor=8", "parallel.tensor=4;parallel.pipeline=2", "parallel.tensor=2;parallel.pipeline=4",
               "parallel.tensor=4", "parallel.tensor=2;parallel.pipeline=2",
               "cluster.nodes=2;parallel.tensor=4;parallel.pipeline=2",
               "cluster.nodes=2;parallel.tensor=8;parallel.pipeline=2"]),
    ("schedule", ["parallel.schedule=1f1b", "parallel.schedule=gpipe",
                  "parallel.schedule=interleaved-1f1b;parallel.virtual_stages=2"]),
    ("recompute", ["training.recompute=none", "training.recompute=selective", "training.recompute=full"]),
    ("max_ops_ahead", ["engine.max_ops_ahead=2", "engine.max_ops_ahead=3", "engine.max_ops_ahead=5"]),
    ("fold", ["engine.fold_tensor_groups=false"]),
    ("slow gpu", ["faults.slow_gpu=[{ranks: [1], factor: 0.7}]", "faults.slow_gpu=[{ranks: [5], factor: 0.9}]",
                  "faults.slow_gpu=[{ranks: [0, 6], factor: 0.8}, {ranks: [6], factor: 0.5}]"]),
    ("slow link", ["faults.slow_link=[{nic: {node: 0, index: 0}, factor: 0.25}]",
                   "faults.slow_link=[{nic: {node: 0, index: 0}, factor: 0.5, start_s: 0.01, end_s: 0.2}]"]),
    # faults the kernels do not take (a factor per start, a draw per kernel): the Python rules beside
    ("other faults", ["faults.slow_gpu=[{ranks: [2], factor: 0.5, start_s: 0.01, end_s: 0.05}]",
                      "faults.jitter={sigma: 0.05, ranks: [6]}"]),
    ("zero", ["parallel.zero_stage=1", "parallel.zero_stage=2", "parallel.zero_stage=3"]),
    ("overlap", ["parallel.tp_comm_overlap=true;parallel.sequence_parallel=true",
                 "parallel.sequence_parallel=false", "parallel.overlap_grad_reduce=false",
                 "parallel.overlap_param_gather=false"]),
    # activations near (or past) the A100's 80 GB: an out-of-memory error inside a block
    ("memory", ["training.seq_length=8192", "training.seq_length=16384",
                "training.seq_length=16384;training.micro_batch_size=8;training.global_batch_size=32",
                "training.seq_length=16384;training.micro_batch_size=16;training.global_batch_size=32"]),
]  # fmt: skip
SHRINK = ["model.num_layers=8", "training.iterations=1"]
# micro and global batch: 1 to 16 microbatches per pipeline (a later "memory" value overrides)
BATCHES = ["training.micro_batch_size=1;training.global_batch_size=8",
           "training.micro_batch_size=2;training.global_batch_size=16",
           "training.micro_batch_size=4;training.global_batch_size=16",
           "training.micro_batch_size=1;training.global_batch_size=16"]  # fmt: skip


# the pipelines of several stages the shards split (cross-shard sends: the lookahead's bounds at
# work), shrunk to run in about a second per engine; (run file, overrides always set, batches)
BIG = [
    ("megatron-175b-64gpu", ["training.iterations=1"],
     ["training.global_batch_size=16", "training.global_batch_size=16;parallel.virtual_stages=1",
      "training.global_batch_size=24;parallel.virtual_stages=1;parallel.schedule=gpipe"]),
    ("megatron-1t-3072gpu", [],
     ["training.global_batch_size=12", "training.global_batch_size=24",
      "training.global_batch_size=12;engine.max_ops_ahead=2"]),
    # A100 and H100 stages (other compute durations per stage), uneven layers per stage
    ("hetero-uneven-pipeline", [], ["training.global_batch_size=8", "training.global_batch_size=16"]),
]  # fmt: skip
BIG_AXES = ["recompute", "max_ops_ahead", "fold", "slow gpu", "slow link", "other faults", "zero", "overlap"]


def cases(seed: int, count: int):
    """``count`` cases ``(run file, overrides, shards)`` the config accepts, drawn from ``seed``: the
    8-GPU run reshaped on one or two nodes, or a long pipeline (every third case)."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        if rng.random() < 1 / 3:
            name, fixed, batches = rng.choice(BIG)
            overrides = [*fixed, *rng.choice(batches).split(";")]
            axes = [axis for axis in AXES if axis[0] in BIG_AXES]
        else:
            name, overrides, axes = BASE.stem, [*SHRINK, *rng.choice(BATCHES).split(";")], AXES
        for _, values in rng.sample(axes, rng.randint(2, 6)):
            overrides += rng.choice(values).split(";")
        path = CONFIGS / "runs" / f"{name}.yaml"
        try:
            load_run(path, overrides)
        except (ConfigError, EmulatorError):
            continue  # a combination the config rejects: drawn again
        made += 1
        yield path, overrides, rng.choice([1, 2, 3, 4])


@contextmanager
def watching():
    """What the compiled engine's blocks did: ``proxies``, ``(start, end, least)`` of every block
    that ran to its end (its proxy's start and ``a``, its last op's end), and the instant-op
    statuses OpCore.instant_stop handled (opkernels.ST_*: counts)."""
    seen = {"proxies": [], "statuses": {}}
    starts = {}
    start_block, block_done, instant_stop = OpCore.start_block, OpCore.block_done, OpCore.instant_stop
    settle = OpCore.settle

    def started(self, gpu, proxy, t):
        starts[proxy] = t  # (the proxy itself, not its id: a done proxy's id is reused by a later one)
        start_block(self, gpu, proxy, t)

    def settled(self, gpu):
        # a block the kernels started where the one before it ended (EMULATOR_TAPE=blocks, one
        # shard: opstreams._chain) passes no start_block; settle gives its proxy that start
        before = self.proxies.get(gpu._ri)  # (none yet: settle before its first block, e.g. an OOM report)
        settle(self, gpu)
        head = self.proxies.get(gpu._ri)
        if head is not None and head is not before:
            starts[head] = head.t_start

    def done(self):
        gpu, proxy, t = block_done(self)
        seen["proxies"].append((starts.pop(proxy), t, proxy.a))
        return gpu, proxy, t

    def stopping(self, gpu, status, t):
        seen["statuses"][status] = seen["statuses"].get(status, 0) + 1
        return instant_stop(self, gpu, status, t)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(OpCore, "start_block", started)
        patch.setattr(OpCore, "block_done", done)
        patch.setattr(OpCore, "settle", settled)
        patch.setattr(OpCore, "instant_stop", stopping)
        yield seen


def assert_same(tmp_path: Path, path: Path, overrides: list[str], shards: int) -> dict:
    """The run directories under both engines, byte for byte; for a run that fails on several shards,
    its error line only: what the other shards had done when one failed depends on the round
    boundaries, on either engine (test_a_failed_run_on_several_shards_writes_the_one_shard_results).
    Every compiled block lasts at least its proxy's least duration (lookahead.block_bound). Returns
    what :func:`watching` saw of the compiled run."""
    tag = f"{path.stem}-{len(list(tmp_path.iterdir()))}"
    case = (path.name, overrides, shards)
    with watching() as seen:
        compiled = run_dir(path, overrides, "compiled", tmp_path / f"{tag}-c", shards, "none")
    short = [(start, end, least) for start, end, least in seen["proxies"] if end - start < least]
    assert not short, (short[:3], *case)
    reference = run_dir(path, overrides, "python", tmp_path / f"{tag}-p", shards, "none")
    if compiled[0] is None or shards == 1:
        assert compiled == reference, case
    else:
        assert compiled[0] == reference[0], case
    return seen


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_small_runs_match(seed, tmp_path):
    """The 8-GPU run reshaped (about 0.2 s a case under both engines)."""
    small = [case for case in cases(seed, 12) if case[0] == BASE][:4]
    assert small
    for path, overrides, shards in small:
        assert_same(tmp_path, path, overrides, shards)


# cases drawn above that reach each instant-op status on 3 in-process shards (which the other
# tests do not run), the pipeline's stages on different shards; (run, overrides, statuses)
SLOW_5 = "faults.slow_gpu=[{ranks: [5], factor: 0.9}]"
TARGETED = [
    ("megatron-22b-8gpu", [*SHRINK, "cluster.nodes=2", "parallel.pipeline=2", "training.micro_batch_size=2",
                           "training.global_batch_size=16", "training.recompute=full",
                           "engine.fold_tensor_groups=false", SLOW_5], {k.ST_IRESUME, k.ST_IBLOCK}),
    ("megatron-175b-64gpu", ["training.iterations=1", "training.global_batch_size=24", "parallel.virtual_stages=1",
                             "parallel.schedule=gpipe", "parallel.sequence_parallel=false", "engine.max_ops_ahead=3",
                             "engine.fold_tensor_groups=false", "training.recompute=none"], {k.ST_IRESUME}),
    # out of memory at a rebuilt layer's alloc inside a backward block: the same error line
    ("megatron-22b-8gpu", [*SHRINK, "cluster.nodes=2", "parallel.pipeline=2", "training.recompute=full",
                           "training.seq_length=16384", "training.micro_batch_size=8", "training.global_batch_size=32",
                           "engine.max_ops_ahead=5"], {k.ST_OOM}),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(TARGETED)))
def test_targeted_runs_match_on_3_shards(case, tmp_path):
    name, overrides, statuses = TARGETED[case]
    seen = assert_same(tmp_path, CONFIGS / "runs" / f"{name}.yaml", overrides, 3)
    assert seen["proxies"] or k.ST_OOM in statuses
    assert statuses <= set(seen["statuses"]), seen["statuses"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 112))
def test_more_fuzzed_runs_match(seed, tmp_path):
    for path, overrides, shards in cases(seed, 3):
        assert_same(tmp_path, path, overrides, shards)


# found by the fuzzing above (seed 2), reduced: two data-parallel replicas of TP 8, one per node,
# out of memory at a rebuilt layer's alloc inside a backward block at t = 7.04 s on both
FAILING = ["cluster.nodes=2", "training.recompute=full", "training.seq_length=16384", "training.global_batch_size=32"]
PARTIAL = (
    "a failed run's partial results on several shards (coordinator.drive -> salvage: each shard's "
    "results up to where it stopped) hold the events the other shards ran past the failure, up to "
    "their round's horizon, so they depend on the round boundaries, which the proxies' bounds change "
    "(and on 1 shard the summary counts 0 events): same error line, other sim_time_s, events, "
    "fingerprint and files"
)


@pytest.mark.xfail(strict=True, reason=PARTIAL)
def test_a_failed_run_on_several_shards_writes_the_same_files_on_both_engines(tmp_path):
    compiled = run_dir(BASE, FAILING, "compiled", tmp_path / "c", 2, "none")
    reference = run_dir(BASE, FAILING, "python", tmp_path / "p", 2, "none")
    assert compiled[0] == reference[0] and compiled[0][0] == "OutOfMemoryError"  # this much holds
    assert compiled[1] == reference[1]


@pytest.mark.xfail(strict=True, reason=PARTIAL)
def test_a_failed_run_on_several_shards_writes_the_one_shard_results(tmp_path):
    one = run_dir(BASE, FAILING, "python", tmp_path / "1", 1, "none")
    two = run_dir(BASE, FAILING, "python", tmp_path / "2", 2, "none")
    assert one[0] == two[0] and one[0][0] == "OutOfMemoryError"
    keys = ("sim_time_s", "events", "fingerprint")
    assert [one[1]["summary.json"][k] for k in keys] == [two[1]["summary.json"][k] for k in keys]


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_the_first_error_in_virtual_time_is_the_one_reported_on_any_shard_count(engine, tmp_path):
    """Two data-parallel replicas, one per node and per shard, run out of memory at the same point of
    their programs; replica 0's GPUs are slower, so replica 1 (ranks 8-15, shard 1) gets there first.
    Both shards meet their OOM in the same round: the later one, on shard 0, used to win (shard
    order: 'rank 0 at t=7.758094 s'); the first in event order does (coordinator.first_error)."""
    overrides = [*FAILING, "faults.slow_gpu=[{ranks: [0, 1, 2, 3, 4, 5, 6, 7], factor: 0.9}]"]
    errors = [run_dir(BASE, overrides, engine, tmp_path / str(shards), shards, "none")[0] for shards in (1, 2, 3)]
    assert errors[0] is not None and "on rank 8 at t=7.041603 s" in errors[0][1]
    assert errors[1] == errors[0] and errors[2] == errors[0]

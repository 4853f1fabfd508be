"""Whole run directories under ``engine.op_engine: compiled`` and ``python``, byte for byte.

tests/emulator/engine/test_opcore.py compares the run results in memory on fuzzed model shapes;
this file fuzzes what reaches a user: every file of the run directory (summary, ranks, links,
timeline, histograms, trace, config, jobs' folders), the error line of a run that fails, over
every shipped run file (configs/runs, shrunk with ``--set`` to run in seconds) crossed with the
axes the engine's gate and kernels depend on - faults (slow GPUs, jitter, slow links and link
windows, node failures), each tier's collective algorithms, schedules, sequence parallelism,
tp_comm_overlap, the torchtitan knobs (eager kernels, op_selective recomputation, ZeRO-3 with
FSDP2's root unit, no dropout), embedding_in_split, traced ranks, timeline buckets,
``max_ops_ahead`` - on 1, 2 and 4 in-process shards. tests/actors/test_opcore_ray.py does the same
on Ray with 2 shards.

Not compared: wall-clock figures, and ``rounds`` on several shards (the lookahead bounds a
compiled block by its proxy's summed durations, opcore.py, so the coordinator may take other
round boundaries; every event and result is the same).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from emulator.config.loader import load_run
from emulator.engine.opcore import OpCore
from emulator.engine.shard import Shard
from emulator.errors import EmulatorError
from emulator.runner.sequence import run_job
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS

WALL_CLOCK = {"wall_time_s", "speed_ratio", "events_per_s", "round_overhead_s", "shard_busy_s"}

# each shipped run file, shrunk (fewer samples or layers) to run in about a second per engine
SHRUNK = {
    "bloom-560m-straggler": ["model.num_layers=4", "training.global_batch_size=128", "training.iterations=1"],
    "bloom-560m-zero2": ["model.num_layers=4", "training.global_batch_size=128", "training.iterations=1"],
    "deepseek-v3-like-256gpu": ["training.global_batch_size=32"],
    "gpt3-175b-1024gpu": ["parallel.virtual_stages=1", "training.global_batch_size=16"],
    "gpt3-175b-nvidia-128gpu": ["training.global_batch_size=32", "parallel.virtual_stages=2"],
    "hetero-uneven-pipeline-planned": [],
    "hetero-uneven-pipeline": ["training.global_batch_size=8"],
    "llama3-70b-zero3-64gpu": ["model.num_layers=4"],
    "llama3-8b-64gpu": ["model.num_layers=4", "training.global_batch_size=32"],
    "llama31-70b-cp-64gpu": ["training.global_batch_size=8"],
    "megatron-175b-64gpu": ["training.global_batch_size=16"],
    "megatron-1t-3072gpu": ["training.global_batch_size=12"],
    "megatron-22b-8gpu": [],
    "mixtral-8x7b-ep8-64gpu": ["training.global_batch_size=16"],
    "two-jobs-shared-nics": ["jobs.0.training.iterations=1", "jobs.1.training.iterations=1"],
}
CHEAP = ["megatron-22b-8gpu", "megatron-175b-64gpu", "megatron-1t-3072gpu", "hetero-uneven-pipeline"]

# (key, values): a case draws a few; one value may set several keys (";" between them)
AXES = [
    (
        "faults",
        [
            "faults.slow_gpu=[{ranks: [1], factor: 0.7}]",
            "faults.jitter={sigma: 0.05}",
            "faults.slow_link=[{nic: {node: 0, index: 0}, factor: 0.25}]",
            "faults.slow_link=[{nic: {node: 0, index: 0}, factor: 0.5, start_s: 0.01, end_s: 0.2}]",
            "faults.fail=[{node: 0, at_s: 0.02}]",
        ],
    ),
    (
        "tier algorithms",
        [
            "cluster.tiers.0.algorithms.all_reduce=tree",
            "cluster.tiers.0.algorithms.all_reduce=hierarchical",
            "cluster.tiers.0.algorithms.all_reduce=halving_doubling",
            "cluster.tiers.0.algorithms.all_gather=halving_doubling",
        ],
    ),
    # a message-level tensor algorithm: no folding (folding.fold_factor), hence the Python rules
    (
        "scale-up algorithms",
        [
            "cluster.scale_up.algorithms.all_reduce=tree",
            "cluster.scale_up.algorithms.reduce_scatter=halving_doubling;engine.fold_tensor_groups=false",
        ],
    ),
    ("schedule", ["parallel.schedule=gpipe", "parallel.schedule=1f1b", "parallel.schedule=interleaved-1f1b"]),
    ("sequence parallel", ["parallel.sequence_parallel=true", "parallel.sequence_parallel=false"]),
    ("overlap", ["parallel.tp_comm_overlap=true;parallel.sequence_parallel=true"]),
    (
        "torchtitan",
        [
            "training.kernels=eager",
            "training.recompute=op_selective",
            "parallel.zero_stage=3",
            "model.dropout=false",
            "training.kernels=eager;training.recompute=op_selective;parallel.zero_stage=3;model.dropout=false",
        ],
    ),
    ("embedding", ["parallel.embedding_in_split=true"]),
    ("recompute", ["training.recompute=none", "training.recompute=full", "training.recompute=selective"]),
    ("max_ops_ahead", ["engine.max_ops_ahead=2", "engine.max_ops_ahead=3", "engine.max_ops_ahead=16"]),
    ("bucket", ["engine.timeline_bucket_us=1", "engine.timeline_bucket_us=37.5"]),
    ("engine", ["engine.fold_tensor_groups=false", "engine.fast_collectives=none"]),
]
TRACES = ["default", "none", "all", "0-3"]


def _scrub(data, shards: int):
    if isinstance(data, dict):
        return {k: _scrub(v, shards) for k, v in data.items()
                if k not in WALL_CLOCK and not (k == "rounds" and shards > 1)}  # fmt: skip
    if isinstance(data, list):
        return [_scrub(v, shards) for v in data]
    return data


def run_dir(path: Path, overrides: list[str], engine: str, out: Path, shards: int = 1, trace="default",
            backend: str = "inline") -> tuple:  # fmt: skip
    """``(error line or None, {file: contents})`` of one run written to ``out``: summary.json
    without wall-clock figures, config.yaml without the op_engine line, other files as bytes."""
    config = load_run(path, [*overrides, f"engine.op_engine={engine}"])
    try:
        run_job(config, out, backend=backend, shards=shards, trace_ranks=trace)
        error = None
    except EmulatorError as exc:  # a hang, an OOM, a failure: both engines must report it alike
        error = (type(exc).__name__, str(exc))
    files = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        name = str(p.relative_to(out))
        if p.name == "summary.json":
            files[name] = _scrub(json.loads(p.read_text()), shards)
        elif p.name == "config.yaml":
            files[name] = [line for line in p.read_text().splitlines() if "op_engine:" not in line]
        else:
            files[name] = p.read_bytes()
    return error, files


def assert_same_run_dirs(tmp_path: Path, path: Path, overrides: list[str], shards: int = 1, trace="default",
                         backend: str = "inline") -> None:  # fmt: skip
    tag = f"{path.stem}-{len(list(tmp_path.iterdir()))}"
    compiled = run_dir(path, overrides, "compiled", tmp_path / f"{tag}-c", shards, trace, backend)
    reference = run_dir(path, overrides, "python", tmp_path / f"{tag}-p", shards, trace, backend)
    case = (path.name, overrides, shards, trace)
    assert compiled[0] == reference[0], case
    assert sorted(compiled[1]) == sorted(reference[1]), case
    for name, contents in compiled[1].items():
        assert contents == reference[1][name], (name, *case)


def _cases(seed: int, count: int, runs: list[str]):
    rng = random.Random(seed)
    made = 0
    while made < count:
        name = rng.choice(runs)
        overrides = list(SHRUNK[name])
        for _, values in rng.sample(AXES, rng.randint(0, 3)):
            overrides += rng.choice(values).split(";")
        path = CONFIGS / "runs" / f"{name}.yaml"
        try:
            config = load_run(path, overrides)
        except (ConfigError, EmulatorError):
            continue  # a combination the config rejects: drawn again
        trace = rng.choice(TRACES if config.cluster.world_size <= 64 else ["default", "none", "0-3"])
        made += 1
        yield path, overrides, rng.choice([1, 2, 4]), trace


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_run_dirs_match(seed, tmp_path):
    for path, overrides, shards, trace in _cases(seed, 3, CHEAP):
        assert_same_run_dirs(tmp_path, path, overrides, shards, trace)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 15))
def test_more_fuzzed_run_dirs_match(seed, tmp_path):
    for path, overrides, shards, trace in _cases(seed, 3, sorted(SHRUNK)):
        assert_same_run_dirs(tmp_path, path, overrides, shards, trace)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHRUNK))
def test_every_shipped_run_dir_matches(name, tmp_path):
    assert_same_run_dirs(tmp_path, CONFIGS / "runs" / f"{name}.yaml", SHRUNK[name])


# tensor groups not folded (each member arrives at its tensor collectives: opstreams._start's
# rendezvous), with the faults that unfold them; "(python)": the faults the kernels do not take
UNFOLDED = [
    ("megatron-22b-8gpu", ["engine.fold_tensor_groups=false"]),
    ("megatron-22b-8gpu", ["parallel.tensor=4", "parallel.pipeline=2"]),  # 4 of 8 GPUs
    ("megatron-22b-8gpu", ["faults.slow_gpu=[{ranks: [5], factor: 0.9}]"]),
    ("megatron-22b-8gpu", ["faults.slow_gpu=[{ranks: [0, 3], factor: 0.7}, {ranks: [3], factor: 0.45}]"]),
    ("megatron-22b-8gpu", ["faults.slow_gpu=[{ranks: [2], factor: 0.5, start_s: 0.01, end_s: 0.05}]"]),  # (python)
    ("megatron-22b-8gpu", ["faults.jitter={sigma: 0.05}"]),  # (python)
    ("megatron-22b-8gpu", ["faults.slow_gpu=[{ranks: [1], factor: 0.8}]", "faults.jitter={sigma: 0.05, ranks: [6]}"]),
    ("megatron-22b-8gpu", ["engine.fold_tensor_groups=false", "parallel.tp_comm_overlap=true",
                           "parallel.sequence_parallel=true", "engine.max_ops_ahead=3"]),
    ("megatron-22b-8gpu", ["faults.slow_gpu=[{ranks: [4], factor: 0.6}]",
                           "faults.slow_link=[{nic: {node: 0, index: 0}, factor: 0.25}]"]),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "faults.slow_gpu=[{ranks: [9], factor: 0.9}]"]),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "engine.fold_tensor_groups=false",
                             "parallel.schedule=gpipe", "engine.timeline_bucket_us=1"]),
    ("megatron-1t-3072gpu", ["training.global_batch_size=12", "faults.slow_gpu=[{ranks: [5], factor: 0.9}]"]),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(UNFOLDED)))
def test_unfolded_tensor_groups_match(case, tmp_path):
    """Unfolded tensor groups under both engines, whole run directories, on 1, 2 and 4 shards in
    turn; untraced, or ranks 0-3 traced (a traced member sends its whole group to the Python rules,
    OpCore._python_group: the other groups run the kernels beside it)."""
    name, overrides = UNFOLDED[case]
    path = CONFIGS / "runs" / f"{name}.yaml"
    shards = (1, 2, 4)[case % 3]
    trace = ("none", "0-3", "none")[case % 3]
    assert_same_run_dirs(tmp_path, path, overrides, shards, trace)


@pytest.mark.parametrize(("overrides", "compiled_expected"), [
    (["engine.fold_tensor_groups=false"], True),
    (["parallel.tensor=4", "parallel.pipeline=2"], True),  # tensor 4 of 8 GPUs
    (["faults.slow_gpu=[{ranks: [5], factor: 0.9}]"], True),
    (["faults.jitter={sigma: 0.05}"], False),  # a draw per kernel: its duration as launched is not fixed
    (["faults.slow_gpu=[{ranks: [2], factor: 0.5, start_s: 0.01, end_s: 0.05}]"], False),  # a factor per start
    # tensor 1: every block is one compute op (bloom-560m-zero2 shrunk: 1.61 s against 1.47 s)
    (["parallel.tensor=1", "parallel.data=8", "training.global_batch_size=32"], False),
    ([], True),  # folded tensor 8
])  # fmt: skip
def test_which_runs_take_the_kernels(overrides, compiled_expected, tmp_path, monkeypatch):
    """The shard's gate (Shard.__init__): unfolded tensor groups and whole-run slow-GPU factors run
    the kernels; jitter, slowdown windows and tensor 1 the Python rules; the results are the same."""
    compiled = []
    build = Shard._compile_ops

    def counting(self):
        compiled.append(self.index)
        build(self)

    from emulator.engine import opkernels as k

    calls = {1: 0, 2: 0}  # the kernels' closed-form calls of one arrival, of several
    flush = OpCore.flush

    def flushing(self):
        for arrivals, n in self.pl[: self.n_pl, [k.P_ARRIVALS, k.P_CALLS]].tolist():
            calls[min(arrivals, 2)] += n
        flush(self)

    monkeypatch.setattr(Shard, "_compile_ops", counting)
    monkeypatch.setattr(OpCore, "flush", flushing)
    # untraced (the default traces rank 0, whose unfolded group then runs the Python rules)
    assert_same_run_dirs(tmp_path, CONFIGS / "runs" / "megatron-22b-8gpu.yaml", overrides, trace="none")
    assert compiled == ([0] if compiled_expected else [])
    folded = not overrides
    # where the kernels run, they run the tensor collectives: each member's arrival when unfolded
    assert (calls[2] > 0) == (compiled_expected and not folded) and (calls[1] > 0) == folded


def test_members_complete_in_arrival_order_with_their_seq_at_completion():
    """opstreams._start for a call of several arrivals, against collective_run._rendezvous: an
    arrival takes no event key; the last one holds the ports from its time, and every member's
    completion is pushed in arrival order with the seq its rank's counter has then (a member's
    compute completions between its arrival and the last one's move its counter on)."""
    import numpy as np

    from emulator.engine import opkernels as k

    members = 4
    rs = np.zeros((members, k.R_FIELDS), np.int64)
    rs[:, k.R_RANK] = [10, 11, 12, 13]
    ops = np.zeros((members, k.O_FIELDS), np.int64)
    ops[:, k.O_KIND] = k.K_M
    pl = np.zeros((1, k.P_FIELDS), np.int64)
    plk = np.array([0, 1, 2], np.int64)
    pl[0, k.P_LLEN], pl[0, k.P_DUR], pl[0, k.P_MEMBERS], pl[0, k.P_ARRIVALS] = 3, 100, members, members
    pl[0, k.P_MSGB], pl[0, k.P_MSGS] = 8, 12
    free = np.array([0, 0, 250], np.int64)
    qn, qm = np.zeros(3, np.int64), np.zeros(3, np.int64)
    g = np.zeros(k.G_FIELDS, np.int64)
    g[k.G_BUCKET] = 1000
    heap = np.zeros((8, 3), np.int64)
    gr = np.zeros((1, k.GR_FIELDS), np.int64)
    args = (np.zeros(4), pl, plk, free, qn, qm, np.zeros(64, np.int64), np.zeros((4, 4), np.int64), heap, g, gr)
    order = [2, 0, 3, 1]  # the members' rank indexes in arrival order, at t = 10, 20, 30, 40
    for i, ri in enumerate(order):
        rs[ri, k.R_SEQ] += 5 * ri  # other events of each rank since: their own counters
        k._start(rs, ops, *args, ri, ri, 10 * (i + 1))
        assert g[k.G_HEAPN] == (0 if i < members - 1 else members)
        assert ops[ri, k.O_TSTART] == 10 * (i + 1)
    # held from the last arrival (40) until the port free last (250) is free: ends at 350
    assert free.tolist() == [350, 350, 350]
    assert qn.tolist() == [0, 0, (250 - 40) * members] and qm.tolist() == [0, 0, members]
    assert pl[0, k.P_CALLS] == 1 and pl[0, k.P_MAXWAIT] == 250 - 40
    assert pl[0, k.P_CNS] == sum(350 - 10 * (i + 1) for i in range(members)) and pl[0, k.P_CCOUNT] == members
    keys = sorted((t, key >> k.SEQ_BITS, key & k.SEQ_MASK, op) for t, key, op in heap[:members].tolist())
    assert keys == sorted((350, 10 + ri, 5 * ri + 1, ri) for ri in order)
    assert rs[:, k.R_SEQ].tolist() == [5 * ri + 1 for ri in range(members)]
    # a member whose call differs: reported (the built-in workload never issues one)
    g[k.G_HEAPN] = 0
    pl2 = np.vstack([pl, pl])
    pl2[1, k.P_SIG] = 1
    ops[1, k.O_VAL] = 1
    args2 = (np.zeros(4), pl2, *args[2:])
    k._start(rs, ops, *args2, 0, 0, 500)
    k._start(rs, ops, *args2, 1, 1, 510)
    assert g[k.G_ERR] == 2


def test_closed_form_hold_equals_the_link_model():
    """opstreams._start on a closed-form op, numba's copy of LinkModel.hold (start_of: the ports
    held together from when all are free, the queueing charged to the port free last, ties to the
    first), on fuzzed port sets and free times; the end-to-end comparisons above reach few ties."""
    import numpy as np

    from emulator.engine import opkernels as k
    from netmodel.links import LinkModel

    rng = random.Random(11)
    n_links = 12
    model = LinkModel(SimpleNamespace(link_bw=[1.0] * n_links))
    rs = np.zeros((1, k.R_FIELDS), np.int64)
    ops = np.zeros((4, k.O_FIELDS), np.int64)
    pl = np.zeros((1, k.P_FIELDS), np.int64)
    plk = np.zeros(n_links, np.int64)
    qn, qm = np.zeros(n_links, np.int64), np.zeros(n_links, np.int64)
    g = np.zeros(k.G_FIELDS, np.int64)
    g[k.G_BUCKET] = 1000
    heap = np.zeros((8, 3), np.int64)
    gr = np.zeros((1, k.GR_FIELDS), np.int64)
    args = (np.zeros(4), pl, plk, model.free, qn, qm, np.zeros(1 << 12, np.int64), np.zeros((64, 4), np.int64))
    for _ in range(500):
        links = rng.sample(range(n_links), rng.randint(1, 6))
        t = rng.randrange(0, 2000)
        for link in range(n_links):  # free times around t, with ties
            model.free_py[link] = rng.choice([0, t, t + 5, t + 5, rng.randrange(0, 3000)])
        duration, members = rng.randrange(1, 500), rng.choice([2, 4, 8])
        before = list(model.free_py)
        expected = model.hold(links, t, duration, members)
        after = list(model.free_py)
        model.free[:] = before
        plk[: len(links)] = links
        pl[0, k.P_LPTR], pl[0, k.P_LLEN], pl[0, k.P_DUR], pl[0, k.P_MEMBERS] = 0, len(links), duration, members
        pl[0, k.P_ARRIVALS] = 1  # folded: one member stands for the group
        pl[0, k.P_MSGB], pl[0, k.P_MSGS] = 1, 1
        ops[0, k.O_KIND], ops[0, k.O_VAL] = k.K_M, 0
        g[k.G_HEAPN] = 0
        k._start(rs, ops, *args, heap, g, gr, 0, 0, t)
        assert list(model.free_py) == after
        assert heap[0, 0] == expected[1]  # its completion: the hold's end
    assert qn.tolist() == model.queued_ns and qm.tolist() == model.queued_messages
    assert any(model.queued_messages)


def test_the_kernels_key_is_the_shards():
    """oploop._run (under opkernels.run) compares its keys ``(t, 2, rank, rank, seq)`` with the shard's other heaps' by
    the literal 2 (numba has no tuple of the shard's constants), and OpCore.top_key gives it back:
    both must stay events.EV_OP_DONE, else the merged order, hence every result, changes."""
    import numpy as np

    from emulator.engine import opkernels as k
    from emulator.engine.events import EV_OP_DONE

    assert EV_OP_DONE == 2
    key = 3 << k.SEQ_BITS | 5  # rank 3, seq 5 (opkernels._push)
    core = SimpleNamespace(top_row=memoryview(np.array([7, key, 0], np.int64)))
    assert OpCore.top_key(core) == (7, EV_OP_DONE, 3, 3, 5)
    # a limit key of the same time, kind and rank but a smaller seq stops the kernel before the op
    g = np.zeros(k.G_FIELDS, np.int64)
    g[k.G_HEAPN] = 1
    heap = np.array([[7, key, 0]], np.int64)
    empty = np.zeros(1, np.int64)
    k._run(np.zeros((1, k.R_FIELDS), np.int64), np.zeros((1, k.O_FIELDS), np.int64), np.zeros(1), np.zeros(1),
          np.zeros((1, k.P_FIELDS), np.int64), empty, empty, empty, empty, empty, np.zeros((1, 4), np.int64),
          heap, g, np.zeros((1, k.GR_FIELDS), np.int64), 7, EV_OP_DONE, 3, 3, 4, k.NO_LIMIT)  # fmt: skip
    assert g[k.G_STATUS] == k.ST_LIMIT and g[k.G_HEAPN] == 1 and g[k.G_EVENTS] == 0


def test_a_block_waiting_for_more_collectives_than_the_kernels_hold_runs_in_python(monkeypatch):
    """Regression (review): launch_rest keeps a compute op's waits in MAX_WAITS per-rank slots and
    numba checks no bounds, so a block with more tensor collectives in a row would have overwritten
    the rank's next fields; such a template is not eligible (its block runs the Python rules)."""
    import numpy as np

    from emulator.engine import opkernels as k

    links = SimpleNamespace(free=np.zeros(2, np.int64))
    shard = SimpleNamespace(gpus={0: SimpleNamespace(trace=None)}, topo=SimpleNamespace(world_size=1), max_ahead=4,
                            stats=SimpleNamespace(bucket_ns=1000), links=links, compute_faults=None)  # fmt: skip
    core = OpCore(shard)
    monkeypatch.setattr(core, "_plan", lambda prepared: 0)
    tensor = (SimpleNamespace(gid=1), SimpleNamespace(ranks=(0,)))

    def block(collectives: int) -> list:
        return [("c", None, 5, 1.0), *[("m", tensor, "tp", False)] * collectives, ("c", None, 5, 1.0)]

    assert core._template(block(k.MAX_WAITS), 0)[0] >= 0
    assert core._template(block(k.MAX_WAITS + 1), 0) == (-1, True)


# the cases where a chunk's layers go as one block, or must not (something runs between them)
LAYER_CASES = [
    ("megatron-1t-3072gpu", ["training.global_batch_size=12"]),
    ("megatron-1t-3072gpu", ["training.global_batch_size=12", "training.recompute=none", "engine.max_ops_ahead=3"]),
    ("megatron-22b-8gpu", ["parallel.tp_comm_overlap=true", "parallel.sequence_parallel=true",
                           "training.recompute=selective"]),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "training.recompute=none",
                             "parallel.zero_stage=1", "parallel.overlap_param_gather=true"]),
    ("megatron-175b-64gpu", ["training.global_batch_size=16", "parallel.zero_stage=3"]),
    ("mixtral-8x7b-ep8-64gpu", ["training.global_batch_size=16", "training.recompute=none"]),
]  # fmt: skip


@pytest.mark.parametrize("seed", range(2))
def test_layers_as_one_block_match_layer_by_layer(seed, tmp_path, monkeypatch):
    """training.run_layers launches a chunk's layers as one block (tensor_parallel.repeat_prepared)
    where nothing runs between them: the run directory is the one of launching them layer by layer,
    under both engines (fuzzed cases of the cheap runs, and the cases above on seed 0)."""
    from emulator.workloads import training

    cases = [(CONFIGS / "runs" / f"{name}.yaml", overrides, 1, "default") for name, overrides in LAYER_CASES]
    cases = (cases if seed == 0 else []) + list(_cases(100 + seed, 3, CHEAP))
    for path, overrides, shards, trace in cases:
        for engine in ("compiled", "python"):
            tag = f"{path.stem}-{len(list(tmp_path.iterdir()))}"
            merged = run_dir(path, overrides, engine, tmp_path / f"{tag}-m", shards, trace)
            with monkeypatch.context() as patch:
                patch.setattr(training, "repeat_prepared", lambda block, times: None)
                single = run_dir(path, overrides, engine, tmp_path / f"{tag}-s", shards, trace)
            case = (path.name, overrides, shards, trace, engine)
            assert merged[0] == single[0], case
            assert sorted(merged[1]) == sorted(single[1]), case
            for name, contents in merged[1].items():
                assert contents == single[1][name], (name, *case)

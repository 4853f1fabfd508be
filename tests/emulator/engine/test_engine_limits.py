"""The compiled engines at their limits (issue 24's review of i24k and i24n), against the Python rules.

opkernels.py / opcore.py: the packed heap keys ``rank << SEQ_BITS | seq`` near their bounds, a
compute op's waits and dependents (MAX_WAITS, MAX_DEPS: a block with more runs the Python rules),
blocks longer than the ring of op slots (OpCore sizes it by the ops in flight, ``max_ops_ahead``).
p2p.py through the compiled message core: pipeline schedules, tags and chunks, stragglers and slow
links on 1 to 4 shards, whole run directories under ``engine.collective_engine: compiled`` and
``python``. Fixed seeds throughout; the default cases run in a few seconds, the rest are slow.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from emulator.config import limits as lim
from emulator.config.loader import load_run
from emulator.engine import opkernels as k
from emulator.engine.events import EV_HANDOVER, EV_OP_DONE
from emulator.engine.netcore import NetCore
from emulator.engine.opcore import OpCore, _grown
from emulator.engine.p2p import PointToPoint
from emulator.engine.shard import Shard
from emulator.errors import EmulatorError, ProgramError
from emulator.runner.sequence import execute
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs, run_dir

# -- packed heap keys ------------------------------------------------------------------------------


def test_packed_keys_order_as_rank_then_seq_up_to_their_bounds():
    """opheap._push / _pop order rows as the key ``(t, rank, seq)`` with rank and seq drawn near
    their bounds (2^23 ranks, 2^40 events of one rank) and ties on time; a seq at the bound is
    reported (G_ERR 3), not wrapped into the next rank's keys."""
    rng = random.Random(24)
    top_rank, top_seq = (1 << k.RANK_BITS) - 1, k.SEQ_LIMIT - 1
    n = 400
    heap = np.zeros((n, 3), np.int64)
    g = np.zeros(k.G_FIELDS, np.int64)
    expected = []
    for op in range(n):
        t = rng.choice([0, 5, 5, 1 << 50, rng.randrange(1 << 62)])
        rank = rng.choice([0, 1, top_rank - 1, top_rank, rng.randrange(top_rank)])
        seq = rng.choice([0, 1, top_seq - 1, top_seq, rng.randrange(top_seq)])
        k._push(heap, g, t, rank, seq, op)
        expected.append((t, rank, seq, op))
    assert g[k.G_ERR] == 0
    popped = []
    while g[k.G_HEAPN]:
        t, key, op = heap[0].tolist()
        popped.append((t, key >> k.SEQ_BITS, key & k.SEQ_MASK, op))
        k._pop(heap, g)
    # (rank, seq) pairs may repeat in this draw; the op breaks no tie the shard could see
    assert [row[:3] for row in popped] == sorted(row[:3] for row in expected)
    assert sorted(popped) == sorted(expected)
    k._push(heap, g, 0, 3, k.SEQ_LIMIT, 0)
    assert g[k.G_ERR] == 3


def test_a_world_past_the_keys_rank_bound_is_refused():
    """OpCore holds ranks below 2^RANK_BITS in its keys and says so (an invariant: no valid
    configuration reaches 8,388,608 GPUs, the next test); one GPU less is taken."""
    shard = _shard(world_size=1 << k.RANK_BITS)
    OpCore(shard)
    shard.topo.world_size += 1
    with pytest.raises(AssertionError, match="more GPUs than its keys hold"):
        OpCore(shard)


@pytest.mark.parametrize(
    "overrides",
    [
        # 2^23 + 1024 GPUs in one node group (MAX_NODES x MAX_GPUS_PER_NODE alone would allow 2^30)
        ["cluster.nodes=8193", "cluster.gpus_per_node=1024"],
        # the same over two node groups (the world size is their sum)
        ["cluster=hetero-a100-h100", "cluster.node_groups.0.nodes=4097", "cluster.node_groups.0.gpus_per_node=1024",
         "cluster.node_groups.1.nodes=4096", "cluster.node_groups.1.gpus_per_node=1024"],
    ],
)
def test_no_valid_config_reaches_the_keys_rank_bound(overrides):
    """The packed keys' bound is an invariant, not a user error: the cluster's world size is bounded
    by MAX_WORLD_SIZE (2^20) well below 2^RANK_BITS (2^23), although its nodes (MAX_NODES) times GPUs
    per node (MAX_GPUS_PER_NODE) are not; a cluster past 2^23 GPUs is refused when the run file is
    loaded - one line naming ``cluster``, exit code 2 - before any engine is built."""
    assert lim.MAX_WORLD_SIZE < 1 << k.RANK_BITS < lim.MAX_NODES * lim.MAX_GPUS_PER_NODE
    with pytest.raises(ConfigError) as info:
        load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", overrides)
    message = str(info.value)
    assert message.startswith("cluster") and f"the emulator's limit is {lim.MAX_WORLD_SIZE}" in message, message
    assert "\n" not in message and info.value.exit_code == 2
    # the limit itself is a valid world
    load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", ["cluster.nodes=1024", "cluster.gpus_per_node=1024",
                                                            "training.global_batch_size=131072"])  # fmt: skip


# -- waits and dependents of a block op ----------------------------------------------------------------


def _shard(world_size: int = 1, max_ahead: int = 64):
    links = SimpleNamespace(free=np.zeros(2, np.int64))
    return SimpleNamespace(gpus={0: SimpleNamespace(trace=None)}, topo=SimpleNamespace(world_size=world_size),
                           max_ahead=max_ahead, stats=SimpleNamespace(bucket_ns=1000), links=links,
                           compute_faults=None)  # fmt: skip


def _core(max_ahead: int = 64) -> OpCore:
    """An OpCore of one rank with one closed-form plan (100 ns on link 0) for every collective."""
    core = OpCore(_shard(max_ahead=max_ahead))
    core._plan = lambda prepared: 0
    core.pl, core.plk = _grown(core.pl, 1), _grown(core.plk, 1)
    core.pl[0, :] = 0
    core.pl[0, k.P_DUR], core.pl[0, k.P_MSGB], core.pl[0, k.P_MSGS], core.pl[0, k.P_MEMBERS] = 100, 8, 1, 1
    core.pl[0, k.P_LPTR], core.pl[0, k.P_LLEN], core.pl[0, k.P_ARRIVALS] = 0, 1, 1
    core.n_pl, core.n_plk = 1, 1
    core._pack()
    return core


TENSOR = (SimpleNamespace(gid=1), SimpleNamespace(ranks=(0,)))
C = ("c", None, 5, 1.0)
M = ("m", TENSOR, "tp", False)  # waited for at once
MO = ("m", TENSOR, "tp", True)  # overlapped: waited for at the next "w"
W = ("w", None, None, None)


def _launch(core: OpCore, block: list) -> int:
    """Launch ``block`` (eligible) on rank index 0 at t = 0, as OpCore.launch's kernel call does."""
    b, _ = core._template(block, 0)
    assert b >= 0
    core.rs[0, k.R_BEGIN] = b
    first = int(core.rs[0, k.R_RING])
    k.launch_rest(*core.args, 0, 0)
    assert core.gm[k.G_ERR] == 0 and core.gm[k.G_STATUS] == k.ST_LAUNCHED
    return first


def test_a_wait_row_counts_among_the_next_compute_ops_waits():
    """Regression (issue 24 review): OpCore._template counted the collectives since the last compute
    op, but a ``"w"`` after it adds the overlapped collective launched *before* that op to the next
    compute op's waits: ``c m(ov) c w m m m m m c`` passed with six waits in launch_rest's five
    R_WAIT0 slots, the sixth written over R_PEND (the rank's pending overlapped collective), left
    set after the block; with ``c m(ov) c w (m(ov) w) x 5 c`` the next "w" cleared R_PEND, hence
    the sixth wait: the last compute op did not wait for the last overlapped collective (5
    dependencies of 6). Such blocks run the Python rules; one wait less still runs the kernels,
    whose last compute op waits for all five with R_PEND clear."""
    core = _core()
    assert core._template([C, MO, C, W, *[M] * k.MAX_WAITS, C], 0) == (-1, True)
    assert core._template([C, MO, C, W, *[MO, W] * k.MAX_WAITS, C], 0) == (-1, True)
    assert core._template([C, MO, C, W, *[M] * (k.MAX_WAITS + 1), C], 0) == (-1, True)
    block = [C, MO, C, W, *[M] * (k.MAX_WAITS - 1), C]
    first = _launch(core, block)
    last = first + len(block) - 2  # (the "w" takes no slot; the first compute op is begin_block's)
    assert core.ops[last, k.O_KIND] == k.K_C
    assert core.ops[last, k.O_DEPS] == k.MAX_WAITS
    assert core.rs[0, k.R_PEND] == -1 and core.rs[0, k.R_NWAIT] == 0


def test_more_collectives_after_a_compute_op_than_it_holds_dependents_run_in_python():
    """A compute op's dependents are the collectives after it (MAX_DEPS), overlapped ones included:
    ``c (m(ov) w)*6 c`` is not eligible, five of them are."""
    core = _core()
    assert core._template([C, *[MO, W] * k.MAX_DEPS, C], 0)[0] >= 0
    assert core._template([C, *[MO, W] * (k.MAX_DEPS + 1), C], 0) == (-1, True)


@pytest.mark.parametrize("seed", range(2))
def test_fuzzed_eligible_blocks_keep_the_kernels_tables_in_bounds(seed):
    """Random rows of compute, collectives (overlapped or not) and waits: every block the template
    takes launches with no table overflow (G_ERR), waits for what the Python rules would have it
    wait for (the count of unfinished collectives), and leaves nothing pending (R_PEND) after it;
    the blocks near the limits are drawn often (runs of up to seven collectives)."""
    rng = random.Random(seed)
    taken = refused = 0
    for _ in range(300):
        core = _core(max_ahead=1 << 20)
        block = [C]
        for _ in range(rng.randint(1, 6)):
            for _ in range(rng.randint(0, 7)):
                block.append(rng.choice([M, M, MO]))
                if block[-1] is MO and rng.random() < 0.7:
                    block.append(W)
            block.append(C)
            if rng.random() < 0.3:
                block.append(W)
        b, _ = core._template(block, 0)
        if b < 0:
            refused += 1
            continue
        taken += 1
        first = _launch(core, block)
        assert core.rs[0, k.R_PEND] == -1, block
        # the Python rules' waits of each compute op (launch_prepared: handle.wait(), pending.wait())
        op, waits, pending = first, 0, None
        for kind, _, _, overlapped in block:
            if kind == "c":
                if op > first:
                    assert core.ops[op, k.O_DEPS] == waits, block
                waits, op = 0, op + 1
            elif kind == "m":
                if overlapped:
                    pending = op
                else:
                    waits += 1
                op += 1
            elif pending is not None:
                waits, pending = waits + 1, None
    assert taken > 50 and refused > 20


# -- blocks longer than the ring -------------------------------------------------------------------

# data parallel, pipeline 1: the last microbatch's backward layers (14 x 19 rows) go as one block, of
# more rows than the ring's 256 slots at max_ops_ahead up to 128
LONG = CONFIGS / "runs" / "llama3-8b-64gpu.yaml"
LONG_OVERRIDES = ["model.num_layers=14", "training.global_batch_size=64"]


def _longest_block(monkeypatch) -> list:
    """Records (rows, ring) of every block the kernels take."""
    seen = []
    template = OpCore._template

    def recording(self, block, rank):
        result = template(self, block, rank)
        if result[0] >= 0:
            seen.append((len(block), int(self.gm[k.G_RING])))
        return result

    monkeypatch.setattr(OpCore, "_template", recording)
    return seen


def _assert_long_blocks_match(tmp_path, monkeypatch, ahead: int, shards: int) -> None:
    seen = _longest_block(monkeypatch)
    assert_same_run_dirs(tmp_path, LONG, [*LONG_OVERRIDES, f"engine.max_ops_ahead={ahead}"], shards, trace="none")
    rows, ring = max(seen)
    assert rows > ring, (rows, ring)


def test_a_block_longer_than_the_ring_at_two_ops_ahead(tmp_path, monkeypatch):
    _assert_long_blocks_match(tmp_path, monkeypatch, 2, 1)


@pytest.mark.slow
@pytest.mark.parametrize(("ahead", "shards"), [(3, 1), (5, 2), (8, 4), (2, 2), (128, 2)])
def test_blocks_longer_than_the_ring_match(ahead, shards, tmp_path, monkeypatch):
    _assert_long_blocks_match(tmp_path, monkeypatch, ahead, shards)


@pytest.mark.slow
def test_long_blocks_with_a_slow_gpu_and_traced_ranks_match(tmp_path, monkeypatch):
    """A whole-run slow GPU (charged durations in the templates) and traced ranks (their groups in
    the Python rules) beside 266-row blocks at three ops ahead."""
    seen = _longest_block(monkeypatch)
    overrides = [*LONG_OVERRIDES, "engine.max_ops_ahead=3", "faults.slow_gpu=[{ranks: [9], factor: 0.8}]"]
    assert_same_run_dirs(tmp_path, LONG, overrides, 2, trace="0-3")
    assert max(seen)[0] > max(seen)[1]


# -- pipeline point-to-point messages in the compiled message core ---------------------------------------

P2P = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"  # tensor 8, pipeline 8, 3 virtual stages


def _p2p_dirs(tmp_path, overrides: list[str], shards: int, monkeypatch) -> tuple:
    """Run directories under the compiled message core and the Python rules (both with the per-op
    kernels, which the core's point-to-point path needs), byte for byte; ``(the error or None,
    the sends the core took)``."""
    results, sent = [], []
    send = NetCore.send

    def counting(self, *args):
        sent.append(args[-1])
        return send(self, *args)

    for engine in ("compiled", "python"):
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}-{engine}"
        with monkeypatch.context() as patch:
            patch.setattr(NetCore, "send", counting)
            # the tapes' messages through the message core: by default one shard's are all the
            # kernels' (the first and last stage's steps taped too), which NetCore.send never sees
            # (test_tape*.py compare the kernels' with these rules)
            patch.setenv("EMULATOR_TAPE", "python")
            results.append(run_dir(P2P, [*overrides, f"engine.collective_engine={engine}"], "compiled", out, shards,
                                   "none"))  # fmt: skip
        if engine == "compiled":
            taken = len(sent)
    assert len(sent) == taken  # (the Python rules send nothing through the core)
    (error, files), (error_ref, files_ref) = results
    assert error == error_ref, overrides
    assert sorted(files) == sorted(files_ref)
    for name, contents in files.items():
        contents_ref = files_ref[name]
        if name.endswith("config.yaml"):  # (the engine's own line)
            contents = [line for line in contents if "collective_engine:" not in line]
            contents_ref = [line for line in contents_ref if "collective_engine:" not in line]
        assert contents == contents_ref, (name, overrides, shards)
    return error, taken


def test_pipeline_messages_with_one_virtual_stage_and_a_slow_gpu_match(tmp_path, monkeypatch):
    """The 1F1B schedule (a receive posted long before its message, and messages waiting in the
    mailbox) with a slow GPU on the last stage, on 3 shards."""
    error, sent = _p2p_dirs(tmp_path, ["training.global_batch_size=16", "parallel.virtual_stages=1",
                                       "faults.slow_gpu=[{ranks: [60], factor: 0.5}]"], 3, monkeypatch)  # fmt: skip
    assert error is None and sent > 0


P2P_AXES = [
    ["parallel.virtual_stages=1;parallel.schedule=gpipe", "parallel.virtual_stages=1;parallel.schedule=1f1b",
     "parallel.virtual_stages=1", "parallel.virtual_stages=2", "parallel.virtual_stages=4", ""],
    ["faults.slow_gpu=[{ranks: [5], factor: 0.9}]", "faults.slow_gpu=[{ranks: [60], factor: 0.3}]",
     "faults.slow_link=[{nic: {node: 3, index: 0}, factor: 0.1}]", "faults.jitter={sigma: 0.05}",
     "faults.slow_link=[{nic: {node: 2, index: 0}, factor: 0.2, start_s: 0.05, end_s: 0.3}]",
     "faults.fail=[{node: 5, at_s: 0.2}]", ""],
    ["training.global_batch_size=8", "training.global_batch_size=24"],
    ["engine.max_ops_ahead=2", "engine.max_ops_ahead=5", ""],
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_pipeline_messages_match(seed, tmp_path, monkeypatch):
    """Schedules, chunks (each a tag), stragglers, slow links, few ops ahead, 1 to 4 shards."""
    rng = random.Random(2400 + seed)
    while True:
        overrides = [v for axis in P2P_AXES for v in rng.choice(axis).split(";") if v]
        try:
            load_run(P2P, overrides)
            break
        except (ConfigError, EmulatorError):
            continue  # a combination the config rejects: drawn again
    error, sent = _p2p_dirs(tmp_path, overrides, rng.choice([1, 2, 3, 4]), monkeypatch)
    # (jitter and node failures run the per-op engine's Python rules, hence the messages' too:
    # Shard.__init__'s gate; a failure is the run's error)
    python_rules = any("jitter" in v or "fail=" in v for v in overrides)
    assert (error is None) != any("fail=" in v for v in overrides), (error, overrides)
    assert (sent > 0) != python_rules, overrides


def _mismatch(engine: str, overrides: list[str], shards: int, rank: int, nth: int, monkeypatch) -> tuple:
    """The error (message, event key) of a run in which ``rank``'s ``nth`` receive expects one byte
    more than it gets (tests/emulator/engine/test_netcore_p2p.py's, on other shapes and shards).

    The hook is PointToPoint._start_recv, which a tape's receive in the kernels (EMULATOR_TAPE=kernel,
    the default on one shard) does not pass: the runs pin ``sends`` so that every receive takes it
    (test_tape_review.py holds the kernels' receive mismatches equal in every mode)."""
    monkeypatch.setenv("EMULATOR_TAPE", "sends")
    start_recv = PointToPoint._start_recv
    seen = []

    def wrong_size(self, gpu, op, t):
        if gpu.rank == rank:
            seen.append(t)
            if len(seen) == nth:
                op.b += 1
        return start_recv(self, gpu, op, t)

    with monkeypatch.context() as patch:
        patch.setattr(PointToPoint, "_start_recv", wrong_size)
        config = load_run(P2P, [*overrides, f"engine.collective_engine={engine}"])
        with pytest.raises(ProgramError) as info:
            execute(config, shards=shards)
    return str(info.value), info.value.event_key


# (overrides, shards, rank, its nth receive, the error's event kind: EV_HANDOVER where the receive
# waited for its message, EV_OP_DONE where the message waited in the mailbox for the receive's start)
SLOW_0 = "faults.slow_gpu=[{ranks: [0], factor: 0.3}]"
MISMATCHES = [
    (["training.global_batch_size=16"], 1, 8, 3, EV_HANDOVER),  # a later forward receive, one shard
    (["training.global_batch_size=16", "faults.slow_gpu=[{ranks: [60], factor: 0.3}]"], 4, 0, 2, EV_HANDOVER),
    (["training.global_batch_size=16", SLOW_0], 4, 0, 3, EV_OP_DONE),  # the straggler's gradients waited
    (["training.global_batch_size=16", "parallel.virtual_stages=1"], 3, 56, 1, EV_HANDOVER),
    (["training.global_batch_size=16", "parallel.virtual_stages=1"], 4, 56, 2, EV_OP_DONE),
    (["training.global_batch_size=16", "parallel.virtual_stages=2", "engine.max_ops_ahead=2"], 2, 16, 4, EV_HANDOVER),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "shards", "rank", "nth", "kind"), MISMATCHES)
def test_a_receive_of_another_size_is_the_same_error_elsewhere(overrides, shards, rank, nth, kind, monkeypatch):
    compiled = _mismatch("compiled", overrides, shards, rank, nth, monkeypatch)
    assert compiled == _mismatch("python", overrides, shards, rank, nth, monkeypatch)
    assert f"rank {rank}: " in compiled[0] and "sizes must be equal" in compiled[0]
    assert compiled[1][1:] == (kind, rank)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "shards"),
    [
        (["training.global_batch_size=16", "faults.jitter={sigma: 0.05, ranks: [60]}"], 2),
        (["training.global_batch_size=16", "parallel.virtual_stages=1", "faults.jitter={sigma: 0.1, ranks: [8]}"], 4),
        (["training.global_batch_size=16", "faults.slow_gpu=[{ranks: [5], factor: 0.5, start_s: 0.01, end_s: 0.2}]"],
         4),
    ],
)  # fmt: skip
def test_shards_with_and_without_the_core_exchange_messages_alike(overrides, shards, tmp_path, monkeypatch):
    """Jitter or a slowdown window on one rank turns the per-op kernels, hence the core's
    point-to-point path, off in its shard only (Shard.__init__'s gate reads the hosted ranks'
    faults): messages cross between a shard whose core sends and receives them and one whose
    Python rules do."""
    flags = []
    compile_messages = Shard._compile_messages

    def recording(self):
        compile_messages(self)
        flags.append(self.p2p_core)

    monkeypatch.setattr(Shard, "_compile_messages", recording)
    error, sent = _p2p_dirs(tmp_path, overrides, shards, monkeypatch)
    assert error is None and sent > 0
    assert True in flags[:shards] and False in flags[:shards]

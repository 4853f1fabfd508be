"""Pipeline point-to-point messages through the compiled message core (emulator/engine/p2p.py,
netcore.NetCore.send / receive, netkernels' hand-over) against the Python rules of p2p.py.

The core takes them in shards that run both compiled engines; ``engine.collective_engine:
python`` keeps them (and collectives) in Python with the per-op engine unchanged, so the pair
isolates the message path. Every observable must be the same bit for bit, on 1 to 4 shards.
"""

from __future__ import annotations

import pytest

from emulator.config.loader import load_run
from emulator.config.schema import ClusterConfig
from emulator.engine.events import EV_HANDOVER, EV_OP_DONE
from emulator.engine.netcore import NetCore
from emulator.engine.netkernels import (
    GROW,
    HEAP_N,
    HT_FILL,
    NO_LIMIT,
    RECV_DONE,
    RET_RANK,
    RET_SEQ,
    RET_T,
    TABLE,
    TABLE_COLS,
)
from emulator.engine.ops import RECV
from emulator.engine.p2p import PointToPoint
from emulator.engine.shard import Shard
from emulator.engine.stats import ShardStats
from emulator.errors import ProgramError
from emulator.runner.sequence import execute
from netmodel.topology import Topology
from tests.conftest import CONFIGS
from tests.emulator.test_netcore import _observables

RUN = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"  # tensor 8, pipeline 8, interleaved: sends across nodes
SMALL = ["training.global_batch_size=16"]


def _run(engine: str, shards: int, overrides=(), monkeypatch=None) -> tuple:
    """``(fingerprint, observables, messages the core sent)`` of the run under ``engine``."""
    sent = []
    if monkeypatch is not None:
        send = NetCore.send

        def counting(self, *args):
            sent.append(args[-1])
            return send(self, *args)

        monkeypatch.setattr(NetCore, "send", counting)
    config = load_run(RUN, [*SMALL, *overrides, f"engine.collective_engine={engine}"])
    summary, result, _ = execute(config, shards=shards)
    if monkeypatch is not None:
        monkeypatch.undo()
    return summary["fingerprint"], _observables(result), len(sent)


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_pipeline_messages_in_the_core_match_the_python_rules(shards, monkeypatch):
    # the tapes' messages through the message core (EMULATOR_TAPE=python): by default one shard's
    # are all the kernels' (opkernels.launch_step), the first and last stage's steps taped too
    # (training.step_block), and this run has no other (one replica: no gradient buckets)
    monkeypatch.setenv("EMULATOR_TAPE", "python")
    fingerprint, observed, sent = _run("compiled", shards, monkeypatch=monkeypatch)
    assert sent > 0  # the sends did take the core
    monkeypatch.setenv("EMULATOR_TAPE", "python")  # (_run's undo took it back)
    reference, expected, sent_ref = _run("python", shards, monkeypatch=monkeypatch)
    assert sent_ref == 0
    assert (fingerprint, observed) == (reference, expected)


def test_a_straggler_and_tiny_arrays_change_nothing(monkeypatch):
    """A slow GPU (tensor groups unfolded: eight times the messages) on 2 shards, the core's arrays
    starting at two rows: each grows (its hash table on a receive's start or a hand-over, its heap
    and outbox on a send)."""
    straggler = ["faults.slow_gpu=[{ranks: [5], factor: 0.9}]"]
    reference = _run("python", 2, straggler)
    monkeypatch.setattr(NetCore, "INITIAL", {name: 2 for name in NetCore.INITIAL})
    assert _run("compiled", 2, straggler) == reference


def _completion_keys(engine: str, shards: int, monkeypatch) -> list[tuple]:
    """The key of every receive's completion event, in both paths: pushed by the Python rules
    (Shard._push) or popped in the core (its RECV_DONE report). A tape's receives stay Python ops
    here (``EMULATOR_TAPE=sends``): in the kernels (the default on one shard) a receive whose message
    waits in the mailbox completes in the op kernels' heap, out of these two hooks' sight;
    test_tape.py holds that mode's whole runs equal to the Python rules'."""
    monkeypatch.setenv("EMULATOR_TAPE", "sends")
    keys = []
    push, core_receive = Shard._push, PointToPoint._core_receive

    def pushed(self, t, kind, gpu, obj):
        push(self, t, kind, gpu, obj)
        if kind == EV_OP_DONE and obj.kind == RECV:
            keys.append((t, kind, gpu.rank, gpu.rank, gpu.seq))

    def reported(self, status):
        st = self.core.st
        if status == RECV_DONE:
            rank = int(st[RET_RANK])
            keys.append((int(st[RET_T]), EV_OP_DONE, rank, rank, int(st[RET_SEQ])))
        core_receive(self, status)

    monkeypatch.setattr(Shard, "_push", pushed)
    monkeypatch.setattr(PointToPoint, "_core_receive", reported)
    execute(load_run(RUN, [*SMALL, f"engine.collective_engine={engine}"]), shards=shards)
    monkeypatch.undo()
    return sorted(keys)


@pytest.mark.parametrize("shards", [1, 2])
def test_receive_completions_have_the_python_rules_keys(shards, monkeypatch):
    """The seq of a completion taken at the hand-over from the rank's one counter: a seq taken
    late, early or not counted would change keys that ties may never reveal in results."""
    compiled = _completion_keys("compiled", shards, monkeypatch)
    assert compiled == _completion_keys("python", shards, monkeypatch)
    assert len(compiled) == len(set(compiled)) > 100


def _mismatch(engine: str, rank: int, nth: int, monkeypatch) -> tuple:
    """The error of a run in which ``rank``'s ``nth`` receive expects one byte more than it gets."""
    start_recv = PointToPoint._start_recv
    seen = {}

    def wrong_size(self, gpu, op, t):
        if gpu.rank == rank:
            seen[rank] = seen.get(rank, 0) + 1
            if seen[rank] == nth:
                op.b += 1
        return start_recv(self, gpu, op, t)

    monkeypatch.setattr(PointToPoint, "_start_recv", wrong_size)
    config = load_run(RUN, [*SMALL, f"engine.collective_engine={engine}"])
    with pytest.raises(ProgramError) as info:
        execute(config, shards=2)
    monkeypatch.undo()
    return str(info.value), info.value.event_key


# a receive posted before its message arrives (the error at the message's hand-over) and one whose
# message waited in the mailbox (the error at the receive's start, in a completion of its rank)
@pytest.mark.parametrize(("rank", "nth", "kind"), [(8, 1, EV_HANDOVER), (0, 1, EV_OP_DONE)])
def test_a_receive_of_another_size_is_the_same_error(rank, nth, kind, monkeypatch):
    compiled = _mismatch("compiled", rank, nth, monkeypatch)
    reference = _mismatch("python", rank, nth, monkeypatch)
    assert compiled == reference
    assert f"rank {rank}: " in compiled[0] and "sizes must be equal" in compiled[0]
    assert compiled[1][1:] == (kind, rank)


def test_the_kernels_table_follows_the_grown_arrays():
    """The kernels take one table of the core's arrays (netkernels.TABLE): after arrays grow (heap,
    messages, mailbox), it names the new ones, and the kernels see every message sent."""
    topo = Topology(ClusterConfig())
    core = NetCore(topo, 0, [0] * topo.world_size, 1, ShardStats(topo))
    first = core.table.copy()
    sends = 3000  # past the first heap, message store and hash table (NetCore.INITIAL)
    for k in range(sends):
        core.send(0, 1, 1 << 20, 7, k, 0)
    for _ in range(64):  # each GROW grows an array (at least doubling it): a few calls at most
        if core.run(None, NO_LIMIT) != GROW:
            break
    else:
        pytest.fail("the kernels keep asking for room: they do not see the grown arrays")
    assert core.heap.shape[0] > NetCore.INITIAL["heap"] and core.htk.shape[0] > NetCore.INITIAL["ht"]
    assert (core.table != first).any()
    for i, name in enumerate(TABLE):
        a = getattr(core, name)
        assert core.args[i] is a, name
        cols = a.shape[1] if a.ndim == 2 else 1
        assert tuple(core.table[TABLE_COLS * i : TABLE_COLS * (i + 1)]) == (a.ctypes.data, a.shape[0], cols), name
    # every hand-over ran in the kernels, over the grown arrays: each message waits in the mailbox
    assert core.events == sends and int(core.st[HT_FILL]) == sends and int(core.st[HEAP_N]) == 0

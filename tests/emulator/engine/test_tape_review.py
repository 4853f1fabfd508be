"""Review of the tapes' messages in the kernels (issue 24: OpCore.launch_send / launch_recv, the
EMULATOR_TAPE modes, the dedicated rules): cases test_tape.py and test_tape_dedicated.py lack, each
run in every EMULATOR_TAPE mode and compared with the program launching every step (``0``) - the
same results bit for bit, or the same error (type, text, event key, exit code).

- a receive of another size whose message already waits in the mailbox when the kernels launch
  the receive (OpCore.launch_recv -> _after -> _mismatch: the receiving rank slowed, few ops ahead);
- a deadlock (a receive with a tag nobody sends) while the kernels' sends are in flight;
- (slow) both on 2-3 in-process shards and with the generic rules (``Shard.dedicated = False``);
- (slow) whole run directories - trace.json included, with traced ranks beside tape ranks - under
  failures, windowed slowdowns, GPipe with few microbatches and 2-3 iterations, max_ops_ahead 2,
  and two jobs in one run where one job's user program uses the pipeline's stream names.
"""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path

import pytest

from emulator.config.loader import load_run
from emulator.engine import api as engine_api
from emulator.engine import opcore as engine_opcore
from emulator.engine import shard as engine_shard
from emulator.engine.opmessages import ST_SENT, ST_STEPPED
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import run_dir

RUN = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
MODES = ["0", "python", "sends", "kernel", "steps", "blocks", "arrays"]
# rank 8 (stage 1) 20x slower: rank 16's backward messages reach it long before it receives them
SLOW_8 = ["faults.slow_gpu=[{ranks: [8], factor: 0.05}]", "engine.fold_tensor_groups=false",
          "engine.max_ops_ahead=2", "training.global_batch_size=16"]  # fmt: skip


@pytest.fixture
def kernel_took(monkeypatch):
    """How many tape sends and receives the kernels took, and where OpCore._mismatch was called from."""
    counts = {"sent": 0, "received": 0, "mismatch_from": []}
    launch_send, launch_recv = engine_opcore.OpCore.launch_send, engine_opcore.OpCore.launch_recv
    launch_step = engine_opcore.OpCore.launch_step
    mismatch = engine_opcore.OpCore._mismatch

    def sending(self, gpu, message, name):
        took = launch_send(self, gpu, message, name)
        counts["sent"] += took
        return took

    def receiving(self, gpu, message, name):
        took = launch_recv(self, gpu, message, name)
        counts["received"] += took
        return took

    def noting(self):
        counts["mismatch_from"].append([f.name for f in traceback.extract_stack()[-4:-1]])
        return mismatch(self)

    def stepping(self, gpu, send, recv):
        status = launch_step(self, gpu, send, recv)
        counts["sent"] += send is not None and status in (ST_SENT, ST_STEPPED)
        counts["received"] += status == ST_STEPPED
        return status

    monkeypatch.setattr(engine_opcore.OpCore, "launch_step", stepping)
    monkeypatch.setattr(engine_opcore.OpCore, "launch_send", sending)
    monkeypatch.setattr(engine_opcore.OpCore, "launch_recv", receiving)
    monkeypatch.setattr(engine_opcore.OpCore, "_mismatch", noting)
    return counts


def _patch_p2p(monkeypatch, kind: str, rank: int, nth: int, change) -> list[int]:
    """The ``nth`` message of ``kind`` that ``rank`` prepares changed by ``change(size, tag)``; the
    returned counter is reset by :func:`_run` before each run."""
    seen = [0]
    prepare = engine_api.GPU.prepare_p2p

    def changed(self, k, peer, size_bytes, tag=0):
        if k == kind and self.rank == rank:
            seen[0] += 1
            if seen[0] == nth:
                size_bytes, tag = change(size_bytes, tag)
        return prepare(self, k, peer, size_bytes, tag)

    monkeypatch.setattr(engine_api.GPU, "prepare_p2p", changed)
    return seen


def _run(overrides: list[str], mode: str, monkeypatch, seen: list[int] | None = None):
    monkeypatch.setenv("EMULATOR_TAPE", mode)
    if seen is not None:
        seen[0] = 0
    config = load_run(RUN, overrides)
    try:
        summary, result, _ = execute(config)
    except EmulatorError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "event_key", None), exc.exit_code
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


def _every_mode(overrides, monkeypatch, seen=None) -> tuple:
    runs = {mode: _run(overrides, mode, monkeypatch, seen) for mode in MODES}
    for mode in MODES[1:]:
        assert runs[mode] == runs["0"], (mode, overrides)
    return runs["0"]


@pytest.mark.parametrize("virtual, nth", [(1, 2), (2, 3)])
def test_a_mismatch_waiting_in_the_mailbox_fails_alike(virtual, nth, kernel_took, monkeypatch):
    """Rank 16's ``nth`` send one byte longer, rank 8 slowed so that the message waits in its
    mailbox when the kernels launch the receive: the error from OpCore.launch_recv equals the
    program's and the Python op engine's."""
    seen = _patch_p2p(monkeypatch, "send", 16, nth, lambda size, tag: (size + 1, tag))
    args = [*SLOW_8, f"parallel.virtual_stages={virtual}"]
    on = _every_mode(args, monkeypatch, seen)
    assert on[0] == "ProgramError" and "sizes must be equal" in on[1] and on[3] == 2, on
    assert on[1].startswith("rank 8: recv(src=16"), on
    assert any("launch_recv" in stack for stack in kernel_took["mismatch_from"]), kernel_took["mismatch_from"]
    assert on == _run([*args, "engine.op_engine=python"], "0", monkeypatch, seen)


@pytest.mark.parametrize("virtual, rank, nth", [(2, 8, 3), (1, 8, 2)])
def test_a_deadlock_with_kernel_sends_in_flight_is_reported_alike(virtual, rank, nth, kernel_took, monkeypatch):
    """Rank ``rank``'s ``nth`` receive with a tag nobody sends: the same error (text,
    event key, exit code 2) with the tapes' sends in the kernels."""
    seen = _patch_p2p(monkeypatch, "recv", rank, nth, lambda size, tag: (size, tag + 7))
    on = _every_mode([*SLOW_8, f"parallel.virtual_stages={virtual}"], monkeypatch, seen)
    # (tensor groups unfolded: a member waits in its started collective for rank 8, which the
    # Python op engine reports as the collective mismatch it is, and now the compiled one too)
    assert on[0] == "CollectiveMismatchError" and on[3] == 2, on
    assert kernel_took["sent"] and kernel_took["received"]


def test_a_deadlock_report_matches_the_python_op_engine(monkeypatch):
    """The compiled op engine names a block that waits as the Python op engine names its ops: its
    first op on ``compute`` and its first tensor collective on ``tp`` (diagnose._heads)."""
    seen = _patch_p2p(monkeypatch, "recv", 24, 1, lambda size, tag: (size, tag + 7))
    args = ["training.global_batch_size=16", "parallel.virtual_stages=1"]
    compiled = _run(args, "0", monkeypatch, seen)
    assert compiled[0] == "DeadlockError", compiled
    assert compiled == _run([*args, "engine.op_engine=python"], "0", monkeypatch, seen)


TWO_JOBS = """\
name: two-jobs-pipelines
cluster: {from: dgx-a100-hdr, nodes: 2}
placement: spread
jobs:
  - name: a
    gpus: 8
    model: megatron-22b
    parallel: {tensor: 2, pipeline: 4, sequence_parallel: true}
    training: {micro_batch_size: 1, global_batch_size: 8, seq_length: 2048, recompute: selective, iterations: 2}
  - name: b
    gpus: 8
    program: prog.py:pp_streams
"""
PROGRAM = '''\
def pp_streams(gpu):
    """Ping-pong between rank pairs on the built-in pipeline's stream names."""
    half = gpu.world_size // 2
    peer = gpu.rank + half if gpu.rank < half else gpu.rank - half
    for _ in range(3):
        gpu.compute("forward", flops=2e11)
        if gpu.rank < half:
            gpu.send(peer, 1 << 22, stream="pp.send")
            gpu.recv(peer, 1 << 22, stream="pp.recv")
        else:
            gpu.recv(peer, 1 << 22, stream="pp.recv")
            gpu.send(peer, 1 << 22, stream="pp.send")
        gpu.mark_iteration()
'''
G16 = ["training.global_batch_size=16"]


TIMEOUT = "faults.collective_timeout_s=5"
SLOW_LINK_WINDOW = "faults.slow_link=[{nic: {node: 1, index: 0}, factor: 0.1, start_s: 0.2, end_s: 0.6}]"
GPIPE_8 = ["training.global_batch_size=8", "parallel.virtual_stages=1", "parallel.schedule=gpipe",
           "training.iterations=3", "engine.max_ops_ahead=2"]  # fmt: skip
GPIPE_9 = ["training.global_batch_size=9", "parallel.virtual_stages=1", "parallel.schedule=gpipe",
           "training.iterations=2"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, trace, kernels",
    [
        # (a failure or a slowdown window keeps the run off the kernels: Shard.__init__ - compared all the same)
        ([*G16, "faults.fail=[{node: 1, at_s: 0.5}]", TIMEOUT], "default", False),
        ([*G16, "faults.fail=[{nic: {node: 1, index: 0}, at_s: 0.3}]", TIMEOUT], "default", False),
        ([*G16, SLOW_LINK_WINDOW], "default", True),
        ([*G16, "faults.slow_gpu=[{ranks: [17], factor: 0.3, start_s: 0.1, end_s: 0.5}]"], "default", False),
        ([*G16, "parallel.virtual_stages=2", "engine.max_ops_ahead=3"], "16", True),  # a traced rank between tapes
        ([*G16, "parallel.virtual_stages=2", "engine.max_ops_ahead=2"], "8,17,24", True),
        (GPIPE_8, "default", True),
        (GPIPE_9, "default", True),
        # (several jobs, or a user program, run no compiled engine: shard.py - nothing of the kernels'
        # to meet the user program's pp.send / pp.recv streams; compared all the same)
        ("two-jobs", "default", False),
    ],
)
def test_run_dirs_match_in_every_mode(overrides, trace, kernels, kernel_took, tmp_path, monkeypatch):
    """Whole run directories (wall-clock fields left out) in every mode and on the Python op engine."""
    path = RUN
    if overrides == "two-jobs":
        path = tmp_path / "two.yaml"
        path.write_text(TWO_JOBS)
        (tmp_path / "prog.py").write_text(PROGRAM)
        overrides = []
    dirs = {}
    for mode in MODES:
        monkeypatch.setenv("EMULATOR_TAPE", mode)
        dirs[mode] = run_dir(Path(path), overrides, "compiled", tmp_path / f"out-{mode}", trace=trace)
    monkeypatch.setenv("EMULATOR_TAPE", "0")
    dirs["engine"] = run_dir(Path(path), overrides, "python", tmp_path / "out-engine", trace=trace)
    assert dirs["0"][1], "no run directory written"
    for mode, got in dirs.items():
        assert got[0] == dirs["0"][0], (mode, got[0], dirs["0"][0])
        assert sorted(got[1]) == sorted(dirs["0"][1]), mode
        for name, contents in got[1].items():
            assert contents == dirs["0"][1][name], (mode, name)
    assert not kernels or (kernel_took["sent"] and kernel_took["received"]), kernel_took


@pytest.mark.slow
@pytest.mark.parametrize("shards, dedicated", [(1, False), (2, True), (3, True)])
@pytest.mark.parametrize(
    "kind, rank, nth, change, virtual",
    [
        ("send", 16, 3, lambda size, tag: (size + 1, tag), 2),
        ("recv", 8, 2, lambda size, tag: (size - 1, tag), 1),  # the receive the shorter one
        ("recv", 8, 5, lambda size, tag: (size + 3, tag), 4),
        ("recv", 8, 3, lambda size, tag: (size, tag + 7), 2),  # a deadlock
    ],
)
def test_errors_alike_on_shards_and_generic_rules(kind, rank, nth, change, virtual, shards, dedicated, monkeypatch):
    """The mailbox mismatches and the deadlock above on several in-process shards (the kernels'
    sends only: receives stay in Python there) and with the generic rules (``Shard.dedicated``)."""
    monkeypatch.setattr(engine_shard.Shard, "dedicated", dedicated)
    seen = _patch_p2p(monkeypatch, kind, rank, nth, change)
    config_args = [*SLOW_8, f"parallel.virtual_stages={virtual}"]
    runs = {}
    for mode in MODES:
        monkeypatch.setenv("EMULATOR_TAPE", mode)
        seen[0] = 0
        try:
            execute(load_run(RUN, config_args), shards=shards)
            runs[mode] = None
        except EmulatorError as exc:
            runs[mode] = type(exc).__name__, str(exc), getattr(exc, "event_key", None), exc.exit_code
    assert runs["0"] is not None and runs["0"][3] == 2, runs["0"]
    for mode in MODES[1:]:
        assert runs[mode] == runs["0"], mode

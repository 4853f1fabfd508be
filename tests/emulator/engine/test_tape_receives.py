"""A tape's kernel receive completed inside the message core's run (opkernels.run_net, EMULATOR_TAPE=steps
and blocks, one shard): the run goes on in the same kernel call where Python would do nothing after the
receive, and returns to Python (NET_KRECV) where it must act (the program's check, an instant op's stop,
the message core's room, a drained receive stream, a receive of another size). Every way gives the
results of one kernel call per receive from Python (``kernel``: p2p.PointToPoint._core_receive ->
OpCore.complete_recv) and of the tapes' messages in Python (``python``), bit for bit, and the Python
round trips per receive are gone."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from emulator.config.loader import load_run
from emulator.engine import api as engine_api
from emulator.engine import opcore as engine_opcore
from emulator.engine import opkernels as k
from emulator.engine.netcore import NetCore
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS


@pytest.fixture
def receives(monkeypatch):
    """The kernels' count of receives completed in the message core's run (G_KRECVS, over the run's
    OpCores), OpCore.complete_recv's Python calls (``False``: a kernel call from Python per receive,
    ``True``: Python's part after run_net) and what each of the latter had to do."""
    counts: collections.Counter = collections.Counter()
    cores: list = []
    init, complete_recv = engine_opcore.OpCore.__init__, engine_opcore.OpCore.complete_recv

    def noting_init(self, shard):
        init(self, shard)
        cores.append(self)

    def noting(self, op, t, done=False):
        counts[done] += 1
        if done:
            g = self.gm
            why = ("status", g[k.G_STATUS]) if g[k.G_STATUS] != k.ST_LIMIT else "low" if g[k.G_LOW] else (
                "drained" if g[k.G_RDRAIN] else "other")  # fmt: skip
            counts[why] += 1
        return complete_recv(self, op, t, done)

    monkeypatch.setattr(engine_opcore.OpCore, "__init__", noting_init)
    monkeypatch.setattr(engine_opcore.OpCore, "complete_recv", noting)

    def taken() -> dict:
        """The counts of the runs since the last call (then cleared)."""
        out = dict(counts, kernel=sum(int(c.g[k.G_KRECVS]) for c in cores))
        counts.clear()
        cores.clear()
        return out

    return taken


def _run(overrides: list[str], mode: str, monkeypatch):
    monkeypatch.setenv("EMULATOR_TAPE", mode)
    config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", overrides)
    try:
        summary, result, _ = execute(config)
    except EmulatorError as exc:  # an error is a result too: every way must report it alike
        return type(exc).__name__, str(exc), getattr(exc, "event_key", None)
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


CASES = [
    ["training.global_batch_size=16"],
    # few ops ahead: a receive's completion resumes the program (ST_RESUME)
    ["training.global_batch_size=16", "engine.max_ops_ahead=3"],
    # a straggler, unfolded: a released block stopped by an instant op (an alloc or free)
    ["training.global_batch_size=16", "faults.slow_gpu=[{ranks: [17], factor: 0.5}]",
     "engine.fold_tensor_groups=false"],
    # interleaved, 4 chunks a stage: several receive streams a rank
    ["training.global_batch_size=32", "parallel.virtual_stages=4", "engine.max_ops_ahead=5"],
]  # fmt: skip


@pytest.mark.parametrize("extra", CASES)
def test_receives_complete_in_the_message_core_run(extra, receives, monkeypatch):
    blocks = _run(extra, "blocks", monkeypatch)
    taken = receives()
    assert blocks[0] != "OutOfMemoryError", blocks
    # the receives completed in the kernels' run, none by a kernel call from Python, few with Python after
    assert taken["kernel"] > 100, taken
    assert taken.get(False, 0) == 0, taken
    if not any(o.startswith("engine.max_ops_ahead") for o in extra):
        # (few ops ahead, most receives resume their program: Python's turn)
        assert taken.get(True, 0) < taken["kernel"] / 4, taken
    assert blocks == _run(extra, "steps", monkeypatch)
    assert receives()["kernel"] == taken["kernel"]
    # the path compared with: a kernel call from Python per receive, the same receives
    assert blocks == _run(extra, "kernel", monkeypatch)
    old = receives()
    assert old["kernel"] == 0 and old[False] >= taken["kernel"], (old, taken)
    assert blocks == _run(extra, "python", monkeypatch)


def test_every_return_to_python_matches(receives, monkeypatch):
    """Tiny message core arrays (NetCore.INITIAL: the core's run stops to grow them, GROW, between
    receives it completes), a receive stream that Python sealed drained by a receive (G_RDRAIN), the
    program's check (ST_RESUME) and an instant op's stop after a receive: each return to Python gives
    the results of ``kernel`` and ``python``."""
    monkeypatch.setattr(NetCore, "INITIAL", {name: 2 for name in NetCore.INITIAL})
    seen: collections.Counter = collections.Counter()
    for extra in CASES[1:3]:
        blocks = _run(extra, "blocks", monkeypatch)
        seen.update(receives())
        assert blocks == _run(extra, "kernel", monkeypatch)
        assert blocks == _run(extra, "python", monkeypatch)
        receives()
    assert seen["drained"] and seen[("status", k.ST_RESUME)], seen
    assert any(key[1] not in (k.ST_RESUME, k.ST_LIMIT) for key in seen if isinstance(key, tuple)), seen


def test_a_receive_of_another_size_fails_alike(receives, monkeypatch):
    """A send one byte longer than its receive (rank 16's): the same ProgramError at the same event,
    met where the message core's run completes receives in the kernels."""
    prepare = engine_api.GPU.prepare_p2p

    def longer(self, kind, peer, size_bytes, tag=0):
        if kind == "send" and self.rank == 16:
            size_bytes += 1
        return prepare(self, kind, peer, size_bytes, tag)

    monkeypatch.setattr(engine_api.GPU, "prepare_p2p", longer)
    extra = ["training.global_batch_size=16"]
    blocks = _run(extra, "blocks", monkeypatch)
    assert blocks[0] == "ProgramError" and "sizes must be equal" in blocks[1], blocks
    assert receives()["kernel"] > 0
    assert blocks == _run(extra, "kernel", monkeypatch)
    assert blocks == _run(extra, "python", monkeypatch)

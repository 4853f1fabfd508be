"""A run of a tape's chained steps launched in one kernel call (EMULATOR_TAPE=arrays,
OpCore.launch_steps, opkernels.launch_steps), their proxies, Allocations and ``held`` entries made
by Python after it: the results are those of ``blocks`` (a kernel call per step) and of the program
launching every step itself (``0``), bit for bit - with few or many ops ahead (the kernels stop
before a step whose proxy would suspend the program, after one that suspends it half way through
its block, ST_SUSPEND) and with a straggler, unfolded (its rank keeps
the per-step path: a fault on the rank). test_tape.py's comparisons (``_kernels``: errors, deadlocks,
out-of-memory reports among them) run this mode too."""

from __future__ import annotations

import collections

import pytest

from emulator.engine import opkernels
from emulator.engine import opmessages as engine_opmessages
from emulator.engine.opkernels import ST_SUSPEND
from emulator.engine.opmessages import ST_STEPPED
from tests.emulator.engine.test_tape_steps import _run


@pytest.fixture
def batches(monkeypatch):
    """Per launch_steps call that launched steps: how many (``n``), the last one's status; and the
    steps Python handed the kernels (``rows``) against those they launched (``launched``)."""
    seen: collections.Counter = collections.Counter()
    kernel, launch_steps = opkernels.launch_steps, engine_opmessages.KernelMessages.launch_steps

    def counting(*args):
        launched = kernel(*args)
        seen["rows"] += args[-1]
        seen["launched"] += launched
        return launched

    def noting(self, gpu, steps, i, held):
        got = launch_steps(self, gpu, steps, i, held)
        if got is not None:
            seen[("n", got[0] - i + 1 if got[0] - i + 1 < 3 else "3+")] += 1
            seen[got[2]] += 1
        return got

    monkeypatch.setattr(engine_opmessages.k, "launch_steps", counting)
    monkeypatch.setattr(engine_opmessages.KernelMessages, "launch_steps", noting)
    return seen


@pytest.mark.parametrize(
    "extra, long",
    [
        # 16 ahead: a block's ops fill the program's room, each call launches one step to ST_SUSPEND
        (["engine.max_ops_ahead=16"], False),
        (["engine.max_ops_ahead=128"], True),
        ([], True),  # 256 ahead: runs of several steps
        (["faults.slow_gpu=[{ranks: [17], factor: 0.5}]", "engine.fold_tensor_groups=false"], True),
    ],
)  # fmt: skip
def test_batched_steps_match(extra, long, batches, monkeypatch):
    args = ["training.global_batch_size=16", *extra]
    arrays = _run(args, "arrays", monkeypatch)
    seen = dict(batches)
    assert arrays[0] != "OutOfMemoryError", arrays
    # calls that ended with the program suspended half way through a block; with room, runs of
    # three steps or more in one call, ended with all three of the last step's launches
    assert seen.get(ST_SUSPEND, 0) > 0, seen
    if long:
        assert seen.get(("n", "3+"), 0) > 0 and seen.get(ST_STEPPED, 0) > 0, seen
    # Python hands the kernels no step they do not launch (its count of the rank's outstanding ops
    # is the kernels': OpCore.launch_steps' ``step_out``)
    assert seen["rows"] == seen["launched"], seen
    assert arrays == _run(args, "blocks", monkeypatch)
    assert arrays == _run(args, "0", monkeypatch)

"""A tape step's block, its send and the next step's receive in one kernel call (EMULATOR_TAPE=steps,
OpCore.launch_step): every way the call can end - the block suspended in the kernels' ring
(ST_SUSPEND), the block and its send with the program to suspend before the receive (ST_SENT), all
three (ST_STEPPED), and the block alone where an instant op stopped it or the Python rules take the
send (ST_LAUNCHED) - gives the results of one kernel call per launch (``kernel``) and of the program
launching every step itself (``0``), bit for bit."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from emulator.config.loader import load_run
from emulator.engine import opcore as engine_opcore
from emulator.engine.opkernels import ST_LAUNCHED, ST_SUSPEND
from emulator.engine.opmessages import ST_SENT, ST_STEPPED
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS


def _run(overrides: list[str], mode: str, monkeypatch):
    monkeypatch.setenv("EMULATOR_TAPE", mode)
    config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", overrides)
    try:
        summary, result, _ = execute(config)
    except EmulatorError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "event_key", None)
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


@pytest.mark.parametrize(
    "extra, ends",
    [
        # few ops ahead: the ring suspends blocks, and sends that leave the program to suspend
        (["engine.max_ops_ahead=3"], {ST_SUSPEND, ST_SENT, ST_STEPPED}),
        # a straggler, unfolded: blocks stopped by an instant op at their end too
        (["faults.slow_gpu=[{ranks: [17], factor: 0.5}]", "engine.fold_tensor_groups=false"],
         {ST_SUSPEND, ST_SENT, ST_STEPPED, ST_LAUNCHED}),
    ],
)  # fmt: skip
def test_every_end_of_a_fused_step_matches(extra, ends, monkeypatch):
    seen: collections.Counter = collections.Counter()
    launch_step = engine_opcore.OpCore.launch_step

    def noting(self, gpu, send, recv):
        status = launch_step(self, gpu, send, recv)
        seen[status] += 1
        return status

    monkeypatch.setattr(engine_opcore.OpCore, "launch_step", noting)
    args = ["training.global_batch_size=16", *extra]
    steps = _run(args, "steps", monkeypatch)
    assert ends <= set(seen), seen
    assert steps[0] != "OutOfMemoryError", steps
    assert steps == _run(args, "kernel", monkeypatch)
    assert steps == _run(args, "blocks", monkeypatch)
    assert steps == _run(args, "0", monkeypatch)

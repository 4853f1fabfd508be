"""Tapes (emulator/engine/tape.py) on Ray with 2 shards: the compiled engine's run, whose untraced
middle stages run their plain steps from tapes, writes the same run directory as the Python rules'
(no tapes: they need the compiled engine), and the fingerprint of one in-process shard.

The driver's EMULATOR_TAPE is the mode every shard runs (EngineSettings.tape, sent with the run):
the session's cluster was started before a test sets it, so its actors' own environment does not
have it (as with a cluster started elsewhere, ``--address``)."""

from __future__ import annotations

import json

import pytest

from emulator.config.loader import load_run
from emulator.errors import ConfigError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import assert_same_run_dirs, run_dir

pytestmark = pytest.mark.ray

RUN = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
SMALL = ["training.global_batch_size=8", "parallel.virtual_stages=1"]


def _tapes_ran(ray) -> list[dict]:
    """What the shard actors kept for the driver's next run report of the run they ran last."""
    from actors.backend import _IDLE

    actors = [actor for kept in _IDLE["idle"].values() for actor in kept]
    assert actors, "no shard actor kept after the run"
    return ray.get([actor.tapes_ran.remote() for actor in actors])


@pytest.mark.parametrize(
    "mode, on, sends, rounds",
    [("0", False, False, "calls"), ("0", False, False, "direct"), ("python", True, False, "direct"),
     ("kernel", True, True, "calls"), ("steps", True, True, "calls"), ("blocks", True, True, "calls")],
)
def test_the_drivers_tape_mode_is_the_shards(mode, on, sends, rounds, ray_cluster, monkeypatch):
    """EMULATOR_TAPE set in the driver only: every actor runs that mode (a receive in the kernels
    needs one shard, so it is off on 2, and so are ``blocks``' chained blocks), and the results are
    the in-process run's."""
    import ray

    monkeypatch.setenv("EMULATOR_TAPE", mode)
    seen = ray.get(ray.remote(lambda: __import__("os").environ.get("EMULATOR_TAPE", "kernel")).remote())
    assert seen != mode or mode == "kernel", "the cluster's processes have the driver's EMULATOR_TAPE"
    config = load_run(RUN, [*SMALL, f"engine.ray_rounds={rounds}"])
    summary, _, _ = execute(config, backend="ray", shards=2)
    ran = _tapes_ran(ray)
    assert len(ran) == 2 and all(r == {"mode": mode, "on": on, "kernel_sends": sends, "kernel_receives": False}
                                 for r in ran), ran  # fmt: skip
    assert summary["fingerprint"] == execute(config, shards=2)[0]["fingerprint"]


def test_an_unknown_tape_mode_is_refused_in_the_driver(ray_cluster, monkeypatch):
    """A typo in the driver's EMULATOR_TAPE is a ConfigError before any shard is built (its actors
    would have run their own environment's mode)."""
    monkeypatch.setenv("EMULATOR_TAPE", "kernels")
    with pytest.raises(ConfigError, match="EMULATOR_TAPE='kernels'") as info:
        execute(load_run(RUN, SMALL), backend="ray", shards=2)
    assert info.value.exit_code == 2


@pytest.mark.slow
def test_tapes_on_ray_match_the_program(ray_cluster, tmp_path):
    # interleaved (3 chunks), programs 2 ops ahead: tapes suspended in every phase of a step; a NIC
    # on the pipeline's path slowed for a window; sends to the other shard through the lookahead
    overrides = ["training.global_batch_size=16", "engine.max_ops_ahead=2",
                 "faults.slow_link=[{nic: {node: 2, index: 0}, factor: 0.1, start_s: 0.05, end_s: 0.2}]"]  # fmt: skip
    path = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
    assert_same_run_dirs(tmp_path, path, overrides, shards=2, trace="none", backend="ray")
    _, inline = run_dir(path, overrides, "compiled", tmp_path / "inline", 1, "none")
    on_ray = json.loads((next(tmp_path.glob("megatron-175b-64gpu-*-c")) / "summary.json").read_text())
    assert on_ray["backend"] == "ray" and on_ray["fingerprint"] == inline["summary.json"]["fingerprint"]

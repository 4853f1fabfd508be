"""Shards lost mid-run or between runs on Ray: a killed or frozen shard process stops the run with
one line naming the shard and its host; a kept actor that died is replaced. These tests kill
processes, so they run on a Ray cluster of their own (``own_ray_cluster``), never the session's.

PYTHONPATH=. python -m pytest -q tests/actors/test_lost_shards.py
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from emulator.config.loader import load_run
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.errors import BackendError
from emulator.runner.sequence import execute
from tests.actors.test_ray_backend import figures
from tests.conftest import CONFIGS, cluster_dict

pytestmark = pytest.mark.ray


class Saboteur:
    """An observer that sends ``sig`` to shard ``index``'s process at its first update."""

    def __init__(self, index: int, sig: int):
        self.index, self.sig = index, sig
        self.pid = None
        self.at = None

    def update(self, rounds, virtual_time_ns, shard_stats):
        if self.pid is None:
            self.pid = shard_stats[self.index]["pid"]
            self.at = time.monotonic()
            os.kill(self.pid, self.sig)


LONG_RUN = ["cluster.nodes=4", "program_args.iterations=3"]  # seconds of rounds on Ray


def test_killed_shard_stops_the_run_naming_it(own_ray_cluster):
    """SIGKILL of a shard's process: BackendError naming the shard and host within seconds."""
    saboteur = Saboteur(1, signal.SIGKILL)
    with pytest.raises(BackendError, match=r"^shard 1 on host \S+.* died: ") as err:
        execute(load_run(CONFIGS / "examples/data-parallel.yaml", LONG_RUN), "ray", 2, observer=saboteur)
    assert saboteur.at is not None and time.monotonic() - saboteur.at < 10
    assert "\n" not in str(err.value)


def test_frozen_shard_is_reported_as_lost(own_ray_cluster, monkeypatch):
    """A shard that stops answering pings (a vanished host) stops the run with its name."""
    import actors.backend

    monkeypatch.setattr(actors.backend, "CHECK_EVERY_S", 0.2)
    monkeypatch.setattr(actors.backend, "PING_TIMEOUT_S", 1.0)
    saboteur = Saboteur(0, signal.SIGSTOP)
    try:
        with pytest.raises(BackendError, match=r"^shard 0 on host \S+.* stopped answering"):
            execute(load_run(CONFIGS / "examples/data-parallel.yaml", LONG_RUN), "ray", 2, observer=saboteur)
        assert time.monotonic() - saboteur.at < 10
    finally:
        if saboteur.pid is not None:
            os.kill(saboteur.pid, signal.SIGKILL)




class Pids:
    """An observer that keeps each shard's process id."""

    def __init__(self):
        self.pids = {}

    def update(self, rounds, virtual_time_ns, shard_stats):
        self.pids.update({s["shard"]: s["pid"] for s in shard_stats})


def test_kept_actors_rerun_edited_programs_and_survive_a_lost_one(own_ray_cluster, tmp_path):
    """Actors kept between runs import an edited program again, and a kept actor that died is replaced."""
    program = tmp_path / "step.py"
    body = "def main(gpu):\n    gpu.compute('f', duration_ns={})\n    gpu.all_reduce(1 << 20)\n"
    program.write_text(body.format(1000))
    config = from_dict(RunConfig, {"program": f"{program}:main", "cluster": cluster_dict(nodes=2, gpus=2)}, "")
    first, second = Pids(), Pids()
    before, _, _ = execute(config, "ray", 2, observer=first)
    program.write_text(body.format(9000))
    edited, _, _ = execute(config, "ray", 2, observer=second)
    assert second.pids == first.pids  # the same actors served both runs
    assert edited["sim_time_s"] == pytest.approx(before["sim_time_s"] + 8e-6)
    os.kill(second.pids[1], signal.SIGKILL)  # a kept, idle actor dies between runs
    again, _, _ = execute(config, "ray", 2)
    assert figures(again) == figures(edited)

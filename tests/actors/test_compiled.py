"""Rounds over a Ray compiled graph (``engine.ray_rounds: compiled``, actors/compiled.py): the same
results and errors as ordinary calls, and a lost shard named."""

from __future__ import annotations

import signal
import time

import pytest

from emulator.config.loader import load_run
from emulator.errors import BackendError, CollectiveMismatchError
from emulator.run import execute
from tests.actors.test_ray_backend import LONG_RUN, Saboteur, figures
from tests.conftest import CONFIGS

pytestmark = pytest.mark.ray
COMPILED = ["engine.ray_rounds=compiled"]


def test_compiled_rounds_give_the_in_process_results(ray_cluster):
    """Four pipeline stages on four shards: every figure of the in-process run with four shards."""
    config = load_run(CONFIGS / "runs/megatron-22b-8gpu.yaml", ["cluster.nodes=4", "parallel.pipeline=4",
                      "model.num_layers=4", "training.global_batch_size=8", *COMPILED])  # fmt: skip
    on_ray, _, _ = execute(config, "ray", 4)
    inline, _, _ = execute(config, "inline", 4)
    assert on_ray["cross_shard_messages"] > 0 and figures(on_ray) == figures(inline)


def test_compiled_rounds_raise_the_users_error(ray_cluster):
    """An error raised inside a shard's round is the in-process one, and the actors serve the next run."""
    config = load_run(CONFIGS / "examples/mismatch.yaml", COMPILED)
    with pytest.raises(CollectiveMismatchError) as inline:
        execute(config, "inline", 2)
    with pytest.raises(CollectiveMismatchError) as on_ray:
        execute(config, "ray", 2)
    assert str(on_ray.value) == str(inline.value)
    again = load_run(CONFIGS / "examples/ping-pong.yaml", ["program_args.iterations=2", *COMPILED])
    assert execute(again, "ray", 2)[0]["fingerprint"] == execute(again, "inline", 1)[0]["fingerprint"]


def test_compiled_rounds_name_a_killed_shard(ray_cluster):
    """SIGKILL of a shard during the graph's rounds: BackendError naming that shard, within seconds."""
    saboteur = Saboteur(1, signal.SIGKILL)
    with pytest.raises(BackendError, match=r"^shard 1 on host \S+.* died: "):
        execute(load_run(CONFIGS / "examples/data-parallel.yaml", [*LONG_RUN, *COMPILED]), "ray", 2, observer=saboteur)
    assert saboteur.at is not None and time.monotonic() - saboteur.at < 10

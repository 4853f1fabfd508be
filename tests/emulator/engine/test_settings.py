"""emulator/engine/settings.py: the engine reads its settings, never the run config."""

from __future__ import annotations

import ast
from pathlib import Path

from emulator.backends.inline import InlineTransport
from emulator.config.loader import load_run
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.engine.coordinator import drive
from emulator.engine.placement import shard_layout
from emulator.engine.settings import EngineSettings
from emulator.engine.shard import Shard
from emulator.results.summary import summarize
from tests.conftest import CONFIGS, ROOT, cluster_dict, run_program

ENGINE = ROOT / "emulator" / "engine"
CONFIG_NAMES = {"config", "run_config"}


def _config_reads(path: Path) -> list[str]:
    """``config.x`` / ``self.config.x`` / ``getattr(config, ...)`` in a module: reads of a run config."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            inner = node.value
            if (isinstance(inner, ast.Name) and inner.id in CONFIG_NAMES) or (
                isinstance(inner, ast.Attribute) and inner.attr in CONFIG_NAMES
            ):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id in CONFIG_NAMES:
                found.append(f"{path.name}:{node.lineno} getattr")
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name == "RunConfig" for a in node.names):
            found.append(f"{path.name}:{node.lineno} imports RunConfig")
    return found


def test_the_engine_reads_no_run_config():
    """No module of emulator/engine/ reads an attribute of a run config: it gets EngineSettings,
    which settings.py alone builds from the run config."""
    modules = [path for path in sorted(ENGINE.glob("*.py")) if path.name != "settings.py"]
    assert {"shard.py", "api.py", "folding.py", "placement.py"} <= {path.name for path in modules}
    assert [read for path in modules for read in _config_reads(path)] == []
    assert _config_reads(ENGINE / "settings.py")  # where they are read, once


def test_the_scan_finds_config_reads(tmp_path):
    """What shard.py did before the settings is found; handing the config on is not a read."""
    source = tmp_path / "reads.py"
    lines = ["def f(self, config):", "    a = config.parallel.pipeline", "    b = getattr(config, 'engine', None)",
             "    c = self.config.training", "    self.config = config"]  # fmt: skip
    source.write_text("\n".join(lines) + "\n")
    assert sorted(r.split(" ", 1)[1] for r in _config_reads(source)) == [".parallel", ".training", "getattr"]


def test_settings_from_a_run_config():
    overrides = ["engine.fast_collectives=none", "engine.timeline_bucket_us=250", "training.precision=fp16"]
    config = load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml", overrides)
    settings = EngineSettings.from_run_config(config)
    assert (settings.builtin_workload, settings.tensor, settings.data, settings.pipeline) == (True, 8, 1, 1)
    assert (settings.fast_collectives, settings.timeline_bucket_ns, settings.precision) == (False, 250_000, "fp16")
    assert settings.faults is config.faults
    program = load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml", ["program=configs/examples/programs.py:ping_pong"])
    settings = EngineSettings.from_run_config(program)
    # a user program with a model: not the built-in workload, but the stages of its model remain
    assert not settings.builtin_workload and settings.tensor == 8
    plain = from_dict(RunConfig, {"program": "x.py:f", "cluster": cluster_dict()}, "")
    scale_up = frozenset(group.scale_up.name for group in plain.cluster.groups())
    assert scale_up and EngineSettings.from_run_config(plain) == EngineSettings(faults=plain.faults,
                                                                                scale_up_tiers=scale_up)


def _exchange(gpu) -> None:
    world = gpu.new_group(range(gpu.world_size))
    gpu.compute("work", flops=1e12 * (1 + gpu.rank % 3))
    gpu.all_reduce(1 << 24, world)
    gpu.args["seen"][gpu.rank] = (gpu.config, gpu.precision)
    gpu.mark_iteration()


def test_a_shard_runs_from_settings_alone():
    """Shards built from EngineSettings and no run config give the run's own results; a program
    still finds the run config, if it was given one, as gpu.config."""
    seen: dict = {}
    reference, _, topo = run_program(_exchange, cluster_dict(), {"seen": seen}, fast="none")
    assert seen[0][0] is not None and seen[0][1] == "bf16"
    settings = EngineSettings(fast_collectives=False, precision="bf16")
    seen.clear()
    layout, rank_shard = shard_layout(topo, 2, settings)
    shards = [Shard(topo, ranks, rank_shard, i, _exchange, settings, {"seen": seen}) for i, ranks in enumerate(layout)]
    result = drive(InlineTransport(shards, topo.world_size), topo.min_cross_node_latency_ns())
    assert summarize(result, topo, 1.0, "inline", 2)["fingerprint"] == reference["fingerprint"]
    assert seen[0] == (None, "bf16")

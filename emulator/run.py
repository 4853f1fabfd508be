"""Run orchestration: pick a backend, run, write the run directory.

emulator run configs/examples/ring.yaml --out runs/ring
"""

from __future__ import annotations

import json
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import yaml

from emulator.config.typed import to_dict
from emulator.errors import ConfigError
from emulator.summary import RunResult, summarize
from netmodel.topology import Topology

BACKENDS = ("inline", "ray")


def default_out_dir(name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{name}"


def execute(config, backend: str = "inline", shards: int = 1, address: str | None = None,
            observer=None, trace_ranks=()) -> tuple[dict, RunResult, Topology]:  # fmt: skip
    """Run a validated config; returns the summary, the raw results and the topology."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {shards}")
    topo = Topology(config.cluster)
    start = time.perf_counter()
    if backend == "inline":
        from emulator.backends.inline import run_inline

        result = run_inline(config, topo, shards, observer=observer, trace_ranks=trace_ranks)
    else:
        from actors.backend import run_ray

        result = run_ray(config, topo, shards, address=address, observer=observer, trace_ranks=trace_ranks)
    wall = time.perf_counter() - start
    summary = summarize(result, topo, wall, backend, shards)
    summary["name"] = config.name
    if config.model is not None:
        from emulator.workloads.metrics import workload_summary

        summary.update(workload_summary(config, result, topo))
    return summary, result, topo


def write_config(out_dir: Path, config) -> Path:
    """Write the resolved config (before the run starts, so that it survives a failed run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def write_run_dir(out_dir: Path, config, summary: dict) -> Path:
    """Write the resolved config and ``summary.json``; returns the directory."""
    write_config(out_dir, config)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out_dir


class _CallableModule(types.ModuleType):
    """Importing this module makes it the attribute ``emulator.run`` (Python sets submodules on their
    package), which the notebook API also needs as a function: calling the module runs
    :func:`emulator.api.run`, so ``emulator.run("configs/examples/ping-pong.yaml")`` always works."""

    def __call__(self, *args, **kwargs):
        from emulator.api import run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

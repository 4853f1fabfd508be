"""Run orchestration: pick a backend, run, write the run directory.

emulator run configs/examples/ring.yaml --out runs/ring
"""

from __future__ import annotations

import json
import math
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import yaml

from emulator.config.typed import to_dict
from emulator.errors import ConfigError, EmulatorError
from emulator.summary import RunResult, summarize
from netmodel.topology import Topology

BACKENDS = ("inline", "ray")


def default_out_dir(name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{name}"


def execute(config, backend: str = "inline", shards: int = 1, address: str | None = None,
            observer=None, trace_ranks=()) -> tuple[dict, RunResult, Topology]:  # fmt: skip
    """Run a validated config; returns the summary, the raw results and the topology.

    Whatever escapes (a user error, a lost shard, Ctrl-C, a bug) carries ``exc.run_summary``: what the
    run reached (:func:`failure_summary`), for the caller to write (:func:`write_failed_run`).
    """
    start = time.perf_counter()
    topo = None
    try:
        if backend not in BACKENDS:
            raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        if shards < 1:
            raise ConfigError(f"--shards must be >= 1, got {shards}")
        topo = Topology(config.cluster)
        start = time.perf_counter()  # the run's wall time: from here
        if backend == "inline":
            from emulator.backends.inline import run_inline

            result = run_inline(config, topo, shards, observer=observer, trace_ranks=trace_ranks)
        else:
            from actors.backend import run_ray

            result = run_ray(config, topo, shards, address=address, observer=observer, trace_ranks=trace_ranks)
        wall = time.perf_counter() - start
        summary = {"status": "completed", **summarize(result, topo, wall, backend, shards)}
        summary["name"] = config.name
        if config.model is not None:
            from emulator.workloads.metrics import workload_summary

            summary.update(workload_summary(config, result, topo))
    except BaseException as exc:
        exc.run_summary = failure_summary(config, exc, backend, shards, time.perf_counter() - start, topo)
        raise
    return summary, result, topo


def _error_line(exc: BaseException) -> str:
    """The one line the command line prints for ``exc`` (a bug: its type and first line)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    text = str(exc)
    if isinstance(exc, EmulatorError):
        return text
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def failure_summary(config, exc: BaseException, backend: str, shards: int, wall_time_s: float,
                    topo: Topology | None = None) -> dict:  # fmt: skip
    """``summary.json`` of a run that did not complete: ``status`` (failed, or interrupted for
    Ctrl-C), ``error`` (the line the command line prints), the virtual time reached, rounds and
    cross-shard messages (what ``coordinator.drive`` attached to ``exc``), and ``lost_shard`` /
    ``lost_shard_host`` when a shard or its host was lost. A run whose shards all reached their
    end with ranks stuck (deadlock, mismatch) also has every figure of a completed run so far.
    """
    stats = getattr(exc, "round_stats", None)
    partial = getattr(exc, "partial_result", None)
    summary = {"status": "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
               "error": _error_line(exc)}  # fmt: skip
    if partial is not None and topo is not None:
        summary.update(summarize(partial, topo, wall_time_s, backend, shards))
        reached_ns = max((r.final_time_ns for r in partial.ranks), default=0)
    else:
        reached_ns = stats.virtual_time_ns if stats is not None and math.isfinite(stats.virtual_time_ns) else 0
    summary.update({
        "name": config.name,
        "backend": backend,
        "shards": shards,
        "world_size": config.cluster.world_size,
        "virtual_time_reached_s": reached_ns / 1e9,
        "rounds": stats.rounds if stats is not None else 0,
        "cross_shard_messages": stats.cross_shard_messages if stats is not None else 0,
        "wall_time_s": wall_time_s,
    })  # fmt: skip
    if getattr(exc, "shard", None) is not None:  # set by the Ray backend on a lost shard or host
        summary["lost_shard"] = exc.shard
        summary["lost_shard_host"] = getattr(exc, "host", None)
    return summary


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


def write_failed_run(out_dir: Path, config, exc: BaseException) -> Path | None:
    """Write what a run that raised ``exc`` reached (``exc.run_summary`` from :func:`execute`) to
    ``summary.json``, with every table too when the run has results so far (deadlock, mismatch);
    returns the summary's path, or None when ``exc`` did not come out of a run."""
    summary = getattr(exc, "run_summary", None)
    if summary is None:
        return None
    partial = getattr(exc, "partial_result", None)
    if partial is not None:
        from emulator.results.rundir import write_results

        write_results(out_dir, config, summary, partial, Topology(config.cluster))
    else:
        write_run_dir(out_dir, config, summary)
    return out_dir / "summary.json"


class _CallableModule(types.ModuleType):
    """Importing this module makes it the attribute ``emulator.run`` (Python sets submodules on their
    package), which the notebook API also needs as a function: calling the module runs
    :func:`emulator.api.run`, so ``emulator.run("configs/examples/ping-pong.yaml")`` always works."""

    def __call__(self, *args, **kwargs):
        from emulator.api import run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

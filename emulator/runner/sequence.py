"""The run sequence, written once: ``emulator run`` and the notebook API's ``emulator.run`` both
call :func:`run_job`.

    emulator run configs/examples/ping-pong.yaml --out runs/pp

Order (:func:`prepare`, then :func:`run_job`): check the backend choice, refuse a run this host
cannot hold (:func:`emulator.runner.budget.require_fits`), build the topology (once per run), parse the
traced ranks, write ``config.yaml`` (so that a run that fails keeps it), run, then write ``summary.json`` and
every table, for a completed run or for what a stopped one reached (``status`` failed or
interrupted), and hand the final figures to the monitor, if any.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from emulator.engine.gc_tuning import relaxed_gc
from emulator.engine.result import RunResult
from emulator.errors import ConfigError, EmulatorError
from emulator.results.rundir import RunTables, build_tables, write_config, write_results, write_run_dir
from emulator.results.summary import summarize
from emulator.results.tables import parse_rank_spec
from emulator.runner.budget import require_fits
from emulator.runner.jobs import job_summaries, write_job_dirs
from emulator.workloads.metrics import workload_summary
from netmodel.topology import Topology

BACKENDS = ("inline", "ray")


def default_out_dir(name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{name}"


@dataclass
class FinishedRun:
    """What :func:`run_job` returns: the summary, the raw results, the tables and the directory."""

    summary: dict
    result: RunResult
    topo: Topology
    tables: RunTables
    run_dir: Path | None


def check_backend(backend: str, shards: int) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {shards}")


@dataclass
class PreparedRun:
    """A run checked and laid out, before anything is written or started (:func:`prepare`)."""

    topo: Topology
    trace_ranks: list[int]


def prepare(config, backend: str = "inline", shards: int = 1, trace_ranks="default") -> PreparedRun:
    """The checks and the topology of a run, in the run's order: the backend choice, the host memory
    (inline: one process holds the run; refused in one line before anything of its size is built,
    since the topology of 10^6 GPUs alone takes seconds), then the topology and the traced ranks."""
    check_backend(backend, shards)
    check_memory = backend == "inline"  # on Ray the shards' hosts hold the run
    if check_memory:
        traced = {"all": config.cluster.world_size, "none": 0}.get(trace_ranks) if isinstance(trace_ranks, str) \
            else (len(trace_ranks) if trace_ranks is not None else None)  # fmt: skip
        traced = require_fits(config, traced_ranks=traced).traced_ranks  # None: the first node's GPUs
    topo = Topology(config.cluster)
    ranks = parse_rank_spec(trace_ranks, topo)
    if check_memory and len(ranks) > traced:
        require_fits(config, traced_ranks=len(ranks))  # a longer list of traced ranks than assumed
    return PreparedRun(topo, ranks)


def run_job(config, out: str | Path | None = None, backend: str = "inline", shards: int = 1,
            address: str | None = None, trace_ranks="default", monitor=None,
            prepared: PreparedRun | None = None) -> FinishedRun:  # fmt: skip
    """Run a validated config; write the run directory when ``out`` is given.

    ``prepared``: what :func:`prepare` gave for this config (the command line prepares first, to
    build its monitor on the run's topology); else prepared here. ``monitor`` (an
    :class:`emulator.monitoring.Monitor` or None) observes the run and gets the final figures, of
    a completed run or of a stopped one, through ``monitor.finish``; keeping its endpoint up
    afterwards (``linger``) is the caller's choice. A run that raises writes what it reached to
    ``out`` before the error goes on.
    """
    if prepared is None:
        prepared = prepare(config, backend, shards, trace_ranks)
    topo = prepared.topo
    if out is not None:
        out = Path(out)
        write_config(out, config)  # before the run: a run that fails (a shard lost) keeps what it wrote
    observer = monitor if monitor is not None and monitor.active else None
    with _collector_aside():
        try:
            summary, result, topo = execute(config, backend, shards, address, observer, prepared.trace_ranks, topo)
        except BaseException as exc:
            if out is not None:
                write_failed_run(out, config, exc, topo)  # summary.json: status, the error, what was reached
            if monitor is not None:
                monitor.finish(getattr(exc, "run_summary", None), getattr(exc, "partial_result", None))
            raise
        if monitor is not None:
            monitor.finish(summary, result)
        if out is not None:
            out, tables = write_outputs(out, config, summary, result, topo)
        else:
            tables = build_tables(config, summary, result, topo)
    return FinishedRun(summary, result, topo, tables, out)


@contextmanager
def _collector_aside() -> Iterator[None]:
    """:func:`emulator.engine.gc_tuning.relaxed_gc` over the run and the writing after it, and
    what was made meanwhile handed to the oldest generation unscanned at the end. The run leaves
    the results (traces, statistics, tables: no cycles) and its shards, whose objects form cycles
    (greenlets, streams, operations: 350,000 objects in the unfolded straggler run); with the
    default thresholds the writing set off a full collection over all of it, 0.5-0.7 s of that
    run's CPU, and a young generation of up to 200,000 objects was scanned when the thresholds came
    back. The shards' cycles are now freed by a later collection, or by the process's end: the
    writing's memory comes on top of them (peak memory within a few per cent of collecting
    first: 370 against 358 MiB for the reference run, 608 against 599 MiB for its straggler
    variant, where the run itself is the peak). Collections change no result."""
    with relaxed_gc():
        try:
            yield
        finally:
            gc.freeze()  # relaxed_gc's end unfreezes everything into the oldest generation


def write_outputs(out_dir: str | Path, config, summary: dict, result: RunResult, topo) -> tuple[Path, RunTables]:
    """The whole run directory (emulator/results/rundir.py) and, for a run with ``jobs``, each job's
    folder under ``jobs/<name>/``; returns the directory and the run's tables."""
    out, tables = write_results(out_dir, config, summary, result, topo)
    if config.jobs:
        write_job_dirs(out, config, summary, result, topo)
    return out, tables


def execute(config, backend: str = "inline", shards: int = 1, address: str | None = None, observer=None,
            trace_ranks=(), topo: Topology | None = None) -> tuple[dict, RunResult, Topology]:  # fmt: skip
    """Run a validated config; returns the summary, the raw results and the topology.

    Whatever escapes (a user error, a lost shard, Ctrl-C, a bug) carries ``exc.run_summary``: what the
    run reached (:func:`failure_summary`), for the caller to write (:func:`write_failed_run`).
    """
    start = time.perf_counter()
    try:
        check_backend(backend, shards)
        if topo is None:
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
            summary.update(workload_summary(config, result, topo))
        if config.jobs:
            summary["jobs"] = job_summaries(config, result, topo)
    except BaseException as exc:
        exc.run_summary = failure_summary(config, exc, backend, shards, time.perf_counter() - start, topo)
        raise
    return summary, result, topo


def error_line(exc: BaseException) -> str:
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
    ``lost_shard_host`` when a shard or its host was lost. Where the shards could still report
    what they measured (``exc.partial_result``), it has every figure of a completed run so far,
    and ``ranks_missing`` counts the ranks of shards that could not.
    """
    stats = getattr(exc, "round_stats", None)
    partial = getattr(exc, "partial_result", None)
    summary = {"status": "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
               "error": error_line(exc)}  # fmt: skip
    if partial is not None and topo is not None:
        summary.update(summarize(partial, topo, wall_time_s, backend, shards))
        reached_ns = max((r.final_time_ns for r in partial.ranks), default=0)
        summary["ranks_missing"] = config.cluster.world_size - len(partial.ranks)
        if config.jobs:
            summary["jobs"] = job_summaries(config, partial, topo)
    else:
        reached_ns = stats.virtual_time_ns if stats is not None and math.isfinite(stats.virtual_time_ns) else 0
    stop_ns = getattr(exc, "stop_ns", None)  # a failure (faults.fail): the run ends when the collective timeout fires
    if stop_ns is not None:
        reached_ns = stop_ns
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


def write_failed_run(out_dir: Path, config, exc: BaseException, topo: Topology | None = None) -> Path | None:
    """Write what a run that raised ``exc`` reached (``exc.run_summary`` from :func:`execute`) to
    ``summary.json``, with every table too when the shards reported their results so far; returns
    the summary's path, or None when ``exc`` did not come out of a run."""
    summary = getattr(exc, "run_summary", None)
    if summary is None:
        return None
    partial = getattr(exc, "partial_result", None)
    if partial is not None:
        write_outputs(out_dir, config, summary, partial, topo if topo is not None else Topology(config.cluster))
    else:
        write_run_dir(out_dir, config, summary)
    return out_dir / "summary.json"

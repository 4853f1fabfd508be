"""Several jobs on one cluster: each job's results cut out of the run's, and its run directory.
Every rank runs its job's program, seeing the job's ranks (``jobs_program`` in
emulator/workloads/programs.py).

    emulator run configs/runs/two-jobs-shared-nics.yaml --out runs/shared
    emulator compare runs/alone runs/shared/jobs/a      # a job's folder is a run directory

The jobs share one emulation: one event loop, one network, one set of links, so ``links.csv`` of
the run holds their combined traffic. Where each job runs and the config its program sees come
from emulator/config/jobs.py; the rank mapping is the mock GPU API's (``GPU.for_job``,
emulator/engine/api.py). GPUs no job occupies run nothing.

Per job, ``summary.json`` (in the run's ``jobs`` list and in ``jobs/<name>/``) has its iteration
times, throughput, MFU, memory and a fingerprint of its ranks' figures; ``jobs/<name>/ranks.csv``
has its ranks numbered as the job sees them (``node`` is the cluster node).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from emulator.engine.result import RunResult, fingerprint, iteration_times_ns
from emulator.results import tables
from emulator.results.rundir import write_csv, write_run_dir
from emulator.workloads.metrics import workload_summary


class JobTopology:
    """What per-rank tables and training figures read of a topology, for a job's own ranks."""

    def __init__(self, topo, ranks: tuple[int, ...]):
        self._topo = topo
        self._ranks = ranks

    def gpu_type(self, rank: int) -> str:
        return self._topo.gpu_type(self._ranks[rank])


def job_result(job, result: RunResult) -> RunResult:
    """The ranks of ``job`` out of the run's results, numbered as the job sees them; no link or
    tier figures (links are shared: the run's links.csv)."""
    local = {r: i for i, r in enumerate(job.ranks)}
    ranks = [dataclasses.replace(r, rank=local[r.rank]) for r in result.ranks if r.rank in local]
    return RunResult(world_size=len(job.ranks), ranks=ranks, links={}, tier_bytes=[], tier_messages=[],
                     size_hist=[], events=0, rounds=0, cross_shard_messages=0, bucket_ns=result.bucket_ns,
                     traces={local[r]: t for r, t in result.traces.items() if r in local})  # fmt: skip


def job_summary(job, result: RunResult, topo) -> dict:
    """One job's figures (``result``: the run's); the training figures for a model job."""
    own = job_result(job, result)
    iters = iteration_times_ns(own)
    summary = {
        "name": job.name,
        "world_size": own.world_size,
        # per node it has GPUs on: the node, its first GPU there and how many
        # (the form of a job's ``slots`` key: paste it to place a job there again)
        "placement": [dataclasses.asdict(s) for s in job.placed],
        "sim_time_s": max((r.final_time_ns for r in own.ranks), default=0) / 1e9,
        "iterations": len(iters),
        "iteration_time_s": (sum(iters) / len(iters) / 1e9) if iters else None,
        "iteration_times_s": [t / 1e9 for t in iters],
        "peak_memory_bytes": max((r.peak_memory_bytes for r in own.ranks), default=0),
        "fingerprint": fingerprint(own),  # of its ranks' figures only
    }
    if job.run.model is not None and len(own.ranks) == own.world_size:
        summary.update(workload_summary(job.run, own, JobTopology(topo, job.ranks)))
    return summary


def job_summaries(config, result: RunResult, topo) -> list[dict]:
    return [job_summary(job, result, topo) for job in config.jobs]


def write_job_dirs(out_dir: Path, config, summary: dict, result: RunResult, topo) -> None:
    """``jobs/<name>/``: each job's ``config.yaml`` (its run as its program saw it), ``summary.json``
    and ``ranks.csv``, a run directory that ``emulator compare`` and ``report`` read."""

    by_name = {s["name"]: s for s in summary.get("jobs", [])}
    for job in config.jobs:
        own = {"status": summary.get("status", "completed"), **by_name.get(job.name, {})}
        folder = write_run_dir(Path(out_dir) / "jobs" / job.name, job.run, own)
        rows = tables.rank_rows(job_result(job, result), JobTopology(topo, job.ranks), job.run)
        write_csv(folder / "ranks.csv", rows, tables.RANK_COLUMNS)

"""The published measurement of a run, when the run is one of ``emulator validate``'s cases.

    from emulator.reports.published import published_rows
    data = read_run_dir("runs/175b")
    published_rows(data.config, data.summary)   # [{"figure": "iteration time", "published": 13.75, ...}]

A run matches a case of Korthikanti et al. 2022 Table 5 (emulator/studies/validation_cases.py) when its
resolved cluster, model, parallelisation and training settings equal the case's exactly (the run's
name, the number of iterations and the engine settings aside), as `configs/runs/megatron-22b-8gpu.yaml`
and `megatron-175b-64gpu.yaml` do. A run that differs in anything else (another batch size, ZeRO,
more nodes) is a different job: no published figure is shown for it.
"""

from __future__ import annotations

from functools import cache

from emulator.studies.validation_cases import KORTHIKANTI, TABLE5

# Sections of the resolved config that define the job; name, engine and iterations do not change the
# iteration time a paper would report.
JOB_SECTIONS = ("cluster", "model", "parallel", "training", "program")


def _job(config: dict) -> dict:
    job = {k: config.get(k) for k in JOB_SECTIONS}
    if isinstance(job["training"], dict):
        job["training"] = {k: v for k, v in job["training"].items() if k != "iterations"}
    return job


@cache
def _cases() -> list[tuple[dict, str, float, float | None]]:
    """(job, case name, published iteration s, published MFU or None) for every Table 5 case."""
    from emulator.config.typed import to_dict
    from emulator.studies.validate import table5_config

    cases = []
    for row in TABLE5:
        variants = (("full", False, row[8], None, "full recompute"),
                    ("selective", True, row[9], row[10], "selective + SP"))  # fmt: skip
        for recompute, sp, iteration_s, mfu, label in variants:
            job = _job(to_dict(table5_config(row, recompute, sp)))
            cases.append((job, f"{row[0]} iteration, {label}", iteration_s, mfu))
    return cases


def _row(case: str, figure: str, published: float, emulated: float, unit: str) -> dict:
    from emulator.studies.validate import _row as validation_row  # the same row `emulator validate` prints

    return {**validation_row(case, emulated, published, unit, f"{KORTHIKANTI}, Table 5"), "figure": figure}


def published_rows(config: dict, summary: dict) -> list[dict]:
    """Published figures next to the run's own: rows of `emulator validate` (``case``, ``predicted`` -
    the run's figure -, ``published``, ``unit``, ``error_pct``, ``source``) plus ``figure``; empty when
    the run matches no validation case (or did not produce the figure)."""
    job = _job(config)
    for case_job, case, iteration_s, mfu in _cases():
        if case_job != job:
            continue
        rows = []
        if summary.get("iteration_time_s") is not None:
            rows.append(_row(case, "iteration time", iteration_s, summary["iteration_time_s"], "s"))
        if mfu is not None and summary.get("mfu") is not None:
            rows.append(_row(case, "MFU", mfu, summary["mfu"], ""))
        return rows
    return []

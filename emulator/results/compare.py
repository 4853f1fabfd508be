"""``emulator compare RUN_A RUN_B``: what changed in the config and in the results, with deltas.

emulator compare runs/dp runs/dp-small-grads          # a table of the changes
emulator compare runs/dp runs/dp-small-grads --json   # every figure, changed or not
"""

from __future__ import annotations

from pathlib import Path

from emulator.results.rundir import RunTables, read_run_dir

# always shown, changed or not: the figures a user looks at first
HEADLINE = ("iteration_time_s", "sim_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu", "bubble_fraction",
            "exposed_comm_fraction", "peak_memory_bytes", "fingerprint")  # fmt: skip
# wall-clock figures differ between any two runs: reported apart so they do not hide real changes
WALL_CLOCK = ("wall_time_s", "speed_ratio", "events_per_s")
BREAKDOWN = ("compute_ns", "comm_ns", "exposed_comm_ns", "exposed_tp_ns", "exposed_dp_ns", "overlapped_comm_ns",
             "bubble_ns", "idle_ns")  # fmt: skip


def flatten(value, prefix: str = "") -> dict:
    """``{"a": {"b": [1, 2]}}`` -> ``{"a.b.0": 1, "a.b.1": 2}``."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return {prefix: value}
    out: dict = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def result_figures(data: RunTables) -> dict:
    """The summary flattened (a run's ``jobs`` by name: ``jobs.a.iteration_time_s``), plus per-rank
    means and per-tier link maxima from the tables."""
    summary = data.summary
    if isinstance(summary.get("jobs"), list):
        summary = {**summary, "jobs": {str(job.get("name", i)): job for i, job in enumerate(summary["jobs"])}}
    figures = flatten(summary)
    if data.ranks:
        for col in BREAKDOWN:
            if col in data.ranks[0]:  # run directories from before a column existed lack it
                figures[f"ranks.mean.{col}"] = round(sum(r[col] for r in data.ranks) / len(data.ranks))
    for row in data.links:
        for col in ("utilisation", "peak_queue_ns"):
            key = f"links.max_{col}.{row['tier']}"
            figures[key] = max(figures.get(key, 0), row[col])
    return figures


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def diff_rows(a: dict, b: dict) -> list[dict]:
    """Every key of either side: values, delta and relative change where both are numbers."""
    rows = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        row = {"key": key, "a": va, "b": vb, "changed": va != vb}
        if _is_number(va) and _is_number(vb):
            row["delta"] = vb - va
            row["relative"] = (vb - va) / va if va else None
        rows.append(row)
    return rows


def compare(run_a: str | Path, run_b: str | Path) -> dict:
    """The comparison of two run directories as plain data (what ``--json`` prints)."""
    a, b = read_run_dir(run_a), read_run_dir(run_b)
    return {
        "a": str(run_a),
        "b": str(run_b),
        "config": [r for r in diff_rows(flatten(a.config), flatten(b.config)) if r["changed"]],
        "results": diff_rows(result_figures(a), result_figures(b)),
        "same_fingerprint": a.summary.get("fingerprint") == b.summary.get("fingerprint"),
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    text = str(v)
    return text if len(text) <= 16 else text[:15] + "~"  # fingerprints: the table stays aligned


def _line(row: dict, width: int) -> str:
    rel = row.get("relative")
    change = f"{rel:+.1%}" if rel is not None else ("" if row["changed"] else "=")
    delta = _fmt(row["delta"]) if "delta" in row and row["changed"] else ""
    return f"  {row['key']:<{width}} {_fmt(row['a']):>16} {_fmt(row['b']):>16} {delta:>16} {change:>9}"


def format_comparison(cmp: dict) -> str:
    """A plain-text report: config changes, then changed results side by side."""
    lines = [f"A: {cmp['a']}", f"B: {cmp['b']}", ""]
    lines.append(f"config: {len(cmp['config'])} change(s)")
    for row in cmp["config"]:
        lines.append(f"  {row['key']}: {_fmt(row['a'])} -> {_fmt(row['b'])}")
    results = cmp["results"]
    shown = [r for r in results if (r["changed"] or r["key"] in HEADLINE) and r["key"] not in WALL_CLOCK]
    shown = [r for r in shown if r["a"] is not None or r["b"] is not None]
    wall = [r for r in results if r["key"] in WALL_CLOCK]
    width = max((len(r["key"]) for r in shown + wall), default=10)
    header = f"  {'':<{width}} {'A':>16} {'B':>16} {'delta':>16} {'change':>9}"
    unchanged = sum(1 for r in results if not r["changed"] and r["key"] not in HEADLINE)
    lines += ["", "results" + ("" if cmp["same_fingerprint"] else " (fingerprints differ)") + ":", header]
    lines += [_line(r, width) for r in shown]
    lines.append(f"  ({unchanged} other figures unchanged; --json lists all)")
    lines += ["", "emulation (wall clock, differs between any two runs):"]
    lines += [_line(r, width) for r in wall]
    return "\n".join(lines)

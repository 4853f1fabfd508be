"""``emulator sweep SWEEP.yaml``: many independent emulations of one base run, in parallel.

    emulator sweep configs/sweeps/bloom-560m-batch-zero.yaml --out runs/sweep-bloom

A sweep file names a base run file (relative to the sweep file) and the points to run, either as a
``grid`` (every combination of the listed values, in the order the keys are written) or as an
explicit list of ``points`` (``{key.path: value}`` mappings, the ``--set`` keys)::

    base: ../runs/bloom-560m-zero2.yaml
    grid:
      training.micro_batch_size: [1, 2, 4, 8]
      parallel.zero_stage: [1, 2]

Each point is a whole emulation on the in-process backend; points run side by side in worker
processes on this machine (``--workers``, default: the cores) or as one Ray task each over a Ray
cluster (``--backend ray``). A point that fails (invalid config, out of memory, deadlock, any
error, over ``--timeout-s``) is a row with its status and one-line reason, never the end of the
sweep. ``DIR/sweep.csv`` is rewritten as points finish, so a stopped sweep keeps what it reached,
and rerunning the same command skips the points already done: a point is keyed by the hash of its
resolved config (``--force`` reruns them all; timed-out points are always run again, since a
timeout says more about the machine than about the config).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from emulator.errors import ConfigError, DeadlockError, OutOfMemoryError

STATUSES = ("ok", "oom", "invalid", "deadlock", "error", "timeout")
# the headline figures of each point, from its summary.json (None where a run has no such figure)
FIGURES = ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_bytes",
           "bubble_fraction", "exposed_comm_fraction", "wall_time_s")  # fmt: skip
MAX_POINTS = 100_000  # a grid multiplies quickly; far beyond what anyone runs in one go
MAX_AXIS_VALUES = 10_000
SWEEP_KEYS = ("base", "grid", "points")


@dataclass
class Point:
    """One point of a sweep: its index, its overrides and its resolved config (or why it has none)."""

    index: int
    knobs: dict[str, Any]
    config: Any = None  # RunConfig, None when invalid
    key: str = ""  # hash of the resolved config (of the overrides when invalid)
    invalid: str | None = None


@dataclass
class Sweep:
    path: Path
    base: Path
    knobs: list[str]  # the keys varied, in the file's order
    points: list[Point] = field(default_factory=list)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; every point's config is resolved here (an invalid one is a
    point with status ``invalid``, not an error of the sweep)."""
    from emulator.config.loader import read_yaml

    path = Path(path)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: the sweep file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a sweep file must be a mapping with base and grid or points")
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"{path}: unknown key {str(unknown[0])[:40]!r}; valid keys: {', '.join(SWEEP_KEYS)}")
    if not isinstance(data.get("base"), str):
        raise ConfigError(f"{path}: base: expected the path of a run file (relative to the sweep file)")
    base = (path.parent / data["base"]).resolve()
    if not base.is_file():
        raise ConfigError(f"{path}: base: no run file {data['base']!r} next to the sweep file")
    if ("grid" in data) == ("points" in data):
        raise ConfigError(f"{path}: give either grid (every combination) or points (a list), not both")
    overrides = _grid(path, data["grid"]) if "grid" in data else _points(path, data["points"])
    knobs: list[str] = []
    for point in overrides:
        knobs.extend(k for k in point if k not in knobs)
    sweep = Sweep(path, base, knobs)
    sweep.points = [_resolve(base, i, point) for i, point in enumerate(overrides)]
    return sweep


def make_sweep(base: str | Path, points: list[dict[str, Any]], name: str = "sweep") -> Sweep:
    """A sweep built in code: ``points`` are ``{key.path: value}`` overrides of the run file ``base``
    (the planner's candidates, for instance)."""
    base = Path(base).resolve()
    if not base.is_file():
        raise ConfigError(f"no run file {str(base)!r}")
    if len(points) > MAX_POINTS:
        raise ConfigError(f"{len(points)} points, at most {MAX_POINTS}")
    knobs: list[str] = []
    for point in points:
        knobs.extend(k for k in point if k not in knobs)
    sweep = Sweep(Path(f"{name}.yaml"), base, knobs)
    sweep.points = [_resolve(base, i, dict(point)) for i, point in enumerate(points)]
    return sweep


def _grid(path: Path, grid: Any) -> list[dict]:
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{path}: grid: expected a mapping of key.path: [values]")
    total = 1
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key}: expected a non-empty list of values")
        if len(values) > MAX_AXIS_VALUES:
            raise ConfigError(f"{path}: grid.{key}: {len(values)} values, at most {MAX_AXIS_VALUES}")
        total *= len(values)
        if total > MAX_POINTS:
            raise ConfigError(f"{path}: grid: more than {MAX_POINTS} combinations")
    keys = [str(k) for k in grid]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _points(path: Path, points: Any) -> list[dict]:
    if not isinstance(points, list) or not points:
        raise ConfigError(f"{path}: points: expected a non-empty list of {{key.path: value}} mappings")
    if len(points) > MAX_POINTS:
        raise ConfigError(f"{path}: points: {len(points)} points, at most {MAX_POINTS}")
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise ConfigError(f"{path}: points[{i}]: expected a mapping {{key.path: value}}")
    return [{str(k): v for k, v in p.items()} for p in points]


def _resolve(base: Path, index: int, knobs: dict) -> Point:
    from emulator.config.loader import load_config
    from emulator.config.typed import to_dict

    point = Point(index, knobs)
    try:
        point.config = load_config(base, knobs)
    except ConfigError as exc:
        point.invalid = str(exc)
        point.key = _digest({"invalid": str(base), "knobs": knobs})
        return point
    point.key = _digest(to_dict(point.config))
    return point


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def classify(exc: BaseException) -> str:
    """The status of a point whose run raised ``exc``."""
    if isinstance(exc, ConfigError):
        return "invalid"
    if isinstance(exc, OutOfMemoryError):
        return "oom"
    if isinstance(exc, DeadlockError):
        return "deadlock"
    return "error"  # mismatch, program errors, backend errors, bugs


def run_point(config) -> dict:
    """Emulate one point; the status, the one-line reason and the headline figures. Never raises
    for the run's own failures (they are the point's status)."""
    from emulator.runner.sequence import error_line, run_job

    try:
        summary = run_job(config, trace_ranks="none").summary
    except Exception as exc:  # user errors and bugs alike: the point's row, not the sweep's end
        return {"status": classify(exc), "reason": error_line(exc)}
    row = {"status": "ok", "reason": ""}
    row.update({f: summary.get(f) for f in FIGURES})
    return row


def csv_columns(knobs: list[str]) -> list[str]:
    return ["point", "config_hash", *knobs, "status", "reason", *FIGURES]


def knob_columns(rows: list[dict]) -> list[str]:
    """The knobs of sweep rows (every column that is not one of :func:`csv_columns`' own), in
    order of first appearance."""
    fixed = set(csv_columns([]))
    knobs: list[str] = []
    for row in rows:
        knobs.extend(k for k in row if k not in fixed and k not in knobs)
    return knobs


def read_done(csv_path: Path) -> dict[str, dict]:
    """Rows of an earlier ``sweep.csv`` by config hash (timeouts left out: they run again)."""
    if not csv_path.is_file():
        return {}
    from emulator.results.rundir import read_csv

    return {str(r["config_hash"]): r for r in read_csv(csv_path) if r.get("status") != "timeout"}


def write_sweep_csv(csv_path: Path, knobs: list[str], rows: list[dict]) -> None:
    """Write every finished row, in point order (atomically: a stopped sweep never leaves half a file)."""
    columns = csv_columns(knobs)
    tmp = csv_path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in sorted(rows, key=lambda r: int(r["point"])):
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    tmp.replace(csv_path)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value)
    return value


def best_row(rows: list[dict]) -> dict | None:
    """The fastest ok point: shortest iteration, then highest tokens/s; None before any."""
    ok = [r for r in rows if r.get("status") == "ok" and number(r.get("iteration_time_s")) is not None]
    if not ok:
        return None
    return min(ok, key=lambda r: (number(r["iteration_time_s"]), int(r["point"])))


def number(value: Any) -> float | None:
    """A figure of a row (a float, or text read back from sweep.csv) as a finite float, else None."""
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class SweepProgress:
    """``points 12/32 | failed 2 | ETA 1m20s | best: point 7, iteration 2.0198 s`` on stderr:
    rewritten in place on a terminal, one line per finished point otherwise."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.total, self.quiet = total, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self.ran = 0  # points run in this invocation (the ETA's pace)

    def eta_s(self, done: int, ran: int) -> float:
        """Wall seconds left at the pace of the points run by this invocation (NaN before one)."""
        return (time.monotonic() - self.start) / ran * (self.total - done) if ran else math.nan

    def show(self, rows: list[dict], eta_s: float, best: dict | None) -> None:
        if self.quiet:
            return
        from emulator.monitoring.progress import format_duration

        failed = sum(1 for r in rows if r.get("status") != "ok")
        line = (f"points {len(rows)}/{self.total} | failed {failed} | ETA {format_duration(eta_s)}"
                + (f" | best: point {best['point']}, iteration {float(best['iteration_time_s']):.4f} s"
                   if best else ""))  # fmt: skip
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


def run_sweep(sweep_path: str | Path | Sweep, out: str | Path | None = None, workers: int | None = None,
              backend: str = "inline", address: str | None = None, timeout_s: float | None = None,
              force: bool = False, quiet: bool = False, metrics=None) -> tuple[Path, list[dict]]:  # fmt: skip
    """Run every point not already in ``OUT/sweep.csv``; returns the directory and the rows.

    ``sweep_path``: a sweep file, or a :class:`Sweep` built in code (:func:`make_sweep`).

    ``metrics`` (an :class:`emulator.monitoring.sweep_metrics.SweepMetrics`, or None) receives the
    rows as they finish.
    """
    sweep = sweep_path if isinstance(sweep_path, Sweep) else load_sweep(sweep_path)
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ConfigError(f"--timeout-s must be a positive number of seconds, got {timeout_s}")
    if backend not in ("inline", "ray"):
        raise ConfigError(f"--backend {backend!r}: choose inline or ray")
    out_dir = Path(out) if out is not None else Path("runs") / f"sweep-{sweep.path.stem}"
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "sweep.csv"
    done = {} if force else read_done(csv_path)
    rows: list[dict] = []
    todo: list[Point] = []
    for p in sweep.points:
        base_row = {"point": p.index, "config_hash": p.key, **p.knobs}
        if p.invalid is not None:
            rows.append({**base_row, "status": "invalid", "reason": p.invalid})
        elif p.key in done:
            rows.append({**done[p.key], **base_row})
        else:
            todo.append(p)
    progress = SweepProgress(len(sweep.points), quiet)
    write_sweep_csv(csv_path, sweep.knobs, rows)

    def publish(ran: int) -> None:
        eta_s, best = progress.eta_s(len(rows), ran), best_row(rows)
        progress.show(rows, eta_s, best)
        if metrics is not None:
            metrics.update(rows, len(sweep.points), eta_s, best)

    def finished(point: Point, result: dict, ran: int) -> None:
        rows.append({"point": point.index, "config_hash": point.key, **point.knobs, **result})
        write_sweep_csv(csv_path, sweep.knobs, rows)
        publish(ran)

    publish(0)
    try:
        if backend == "ray":
            _run_on_ray(todo, finished, address, timeout_s, workers)
        else:
            _run_local(todo, finished, workers or os.cpu_count() or 1, timeout_s)
    finally:
        progress.close()
    return out_dir, sorted(rows, key=lambda r: int(r["point"]))


def _run_local(todo: list[Point], finished, workers: int, timeout_s: float | None) -> None:
    """One forked process per point, at most ``workers`` at a time; a point past ``timeout_s`` is
    killed. Forking shares this process's imports and compiled kernels with every point."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = list(reversed(todo))
    running: dict = {}  # connection -> (process, point, started)
    ran = 0
    try:
        while queue or running:
            while queue and len(running) < workers:
                point = queue.pop()
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_point_process, args=(point.config, send), daemon=True)
                proc.start()
                send.close()
                running[receive] = (proc, point, time.monotonic())
            ready = multiprocessing.connection.wait(list(running), timeout=0.2)
            for conn in ready:
                proc, point, _ = running.pop(conn)
                try:
                    result = conn.recv()
                except EOFError:  # the process died without answering (killed, out of host memory)
                    proc.join()
                    result = {"status": "error", "reason": f"the point's process ended with exit code {proc.exitcode}"}
                conn.close()
                proc.join()
                ran += 1
                finished(point, result, ran)
            if timeout_s is not None:
                now = time.monotonic()
                for conn, (proc, point, started) in list(running.items()):
                    if now - started > timeout_s:
                        proc.kill()
                        proc.join()
                        conn.close()
                        del running[conn]
                        ran += 1
                        finished(point, {"status": "timeout", "reason": f"still running after {timeout_s:g} s"}, ran)
    finally:
        for proc, _, _ in running.values():  # Ctrl-C or an error: no point outlives the sweep
            proc.kill()
            proc.join()


def _point_process(config, send) -> None:
    try:
        result = run_point(config)
    except BaseException as exc:  # Ctrl-C in a worker: the parent decides what happens
        result = {"status": "error", "reason": f"{type(exc).__name__}"}
    send.send(result)
    send.close()


def _run_on_ray(todo: list[Point], finished, address: str | None, timeout_s: float | None,
                workers: int | None = None) -> None:  # fmt: skip
    """One Ray task per point (one CPU each) over the cluster; a task past ``timeout_s`` is cancelled.

    At most as many tasks are in flight as the cluster has CPUs (or ``workers``, when fewer), so
    that a point's clock starts when it can start running rather than while it waits in Ray's queue.
    """
    from actors.backend import connect, import_ray

    ray = import_ray()
    started_ray = connect(ray, address)
    task = ray.remote(num_cpus=1, max_retries=0)(run_point)
    slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if workers is not None:
        slots = min(slots, workers)
    queue = list(reversed(todo))
    refs: dict = {}
    ran = 0
    try:
        while queue or refs:
            while queue and len(refs) < slots:
                point = queue.pop()
                refs[task.remote(point.config)] = (point, time.monotonic())
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
            for ref in ready:
                point, _ = refs.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the task's worker or host was lost
                    result = {"status": "error", "reason": f"Ray task failed: {str(exc).splitlines()[0][:200]}"}
                ran += 1
                finished(point, result, ran)
            if timeout_s is not None:
                now = time.monotonic()
                for ref, (point, started) in list(refs.items()):
                    if now - started > timeout_s:
                        ray.cancel(ref, force=True)
                        del refs[ref]
                        ran += 1
                        finished(point, {"status": "timeout", "reason": f"still running after {timeout_s:g} s"}, ran)
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        if started_ray:
            ray.shutdown()


def format_rows(rows: list[dict]) -> str:
    """The sweep as a table: one line per point, the knobs, status and headline figures."""
    if not rows:
        return "no points"
    knobs = knob_columns(rows)
    header = ["point", *knobs, "status", "iteration s", "tokens/s", "MFU", "peak GiB"]
    lines = []
    for r in rows:
        if r.get("status") == "ok":
            figures = [_fmt(r.get("iteration_time_s"), ".4f"), _fmt(r.get("tokens_per_s"), ",.0f"),
                       _fmt(r.get("mfu"), ".3f"), _fmt(_gib(r.get("peak_memory_bytes")), ".2f")]  # fmt: skip
        else:
            figures = [str(r.get("reason", ""))[:100], "", "", ""]
        lines.append([str(r["point"]), *(_knob(r[k]) if k in r else "-" for k in knobs), str(r.get("status")),
                      *figures])  # fmt: skip
    fixed = len(knobs) + 2  # point, knobs, status: every row has them; figures only ok rows
    widths = [max([len(h)] + [len(line[i]) for line in lines if i < fixed or line[fixed - 1] == "ok"])
              for i, h in enumerate(header)]  # fmt: skip
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    for line in lines:
        if line[fixed - 1] == "ok":
            out.append("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
        else:  # the reason runs on past the figure columns
            out.append("  ".join(c.rjust(w) for c, w in zip(line[:fixed], widths, strict=False)) + f"  {line[fixed]}")
    return "\n".join(out)


def _fmt(value: Any, spec: str) -> str:
    figure = number(value)
    return format(figure, spec) if figure is not None else "-"


def _gib(value: Any) -> float | None:
    figure = number(value)
    return figure / 2**30 if figure is not None else None


def _knob(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)

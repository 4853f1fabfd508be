"""Live Prometheus figures of ``emulator sweep`` (``--metrics-port``): points done by status, the
ETA, the best point so far and each finished point's headline figures.

    emulator sweep configs/sweeps/bloom-560m-batch-zero.yaml --metrics-port 9431

Served by the same :class:`~emulator.monitoring.exporter.Exporter` as a run's figures; every series
carries the ``run`` label (the sweep directory's name), as a run's do.
"""

from __future__ import annotations

import math

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from emulator.monitoring.exporter import Exporter

STATUSES = ("ok", "oom", "invalid", "deadlock", "error", "timeout")
POINT_FIGURES = {  # metric suffix -> (sweep.csv column, help)
    "iteration_seconds": ("iteration_time_s", "Virtual seconds per iteration of each ok point"),
    "tokens_per_second": ("tokens_per_s", "Training tokens per virtual second of each ok point"),
    "mfu_ratio": ("mfu", "Model FLOPs utilisation of each ok point"),
    "peak_memory_bytes": ("peak_memory_bytes", "Peak GPU memory of each ok point (largest rank)"),
}


class SweepCollector:
    """Figures of the rows finished so far (``snapshot = (rows, total, eta_s, best)``)."""

    def __init__(self, run_id: str, sweep_file: str) -> None:
        self.run_id, self.sweep_file = run_id, sweep_file
        self.snapshot: tuple[list[dict], int, float, dict | None] = ([], 0, math.nan, None)

    def collect(self):
        rows, total, eta_s, best = self.snapshot
        run = {"run": self.run_id}
        yield InfoMetricFamily("emulator_sweep", "The sweep: its id and file", value={**run, "file": self.sweep_file})
        for name, value, doc in (
            ("emulator_sweep_points_total", total, "Points in the sweep"),
            ("emulator_sweep_points_done", len(rows), "Points finished (any status)"),
            ("emulator_sweep_eta_seconds", eta_s, "Estimated wall seconds until every point is done"),
        ):
            g = GaugeMetricFamily(name, doc, labels=["run"])
            g.add_metric([self.run_id], float(value))
            yield g
        by_status = GaugeMetricFamily("emulator_sweep_points", "Points finished, by status", labels=["run", "status"])
        for status in STATUSES:
            by_status.add_metric([self.run_id, status], float(sum(r.get("status") == status for r in rows)))
        yield by_status
        for suffix, (column, doc) in POINT_FIGURES.items():
            best_g = GaugeMetricFamily(f"emulator_sweep_best_{suffix}", f"{doc}: the best point so far",
                                       labels=["run", "point"])  # fmt: skip
            if best is not None and _finite(best.get(column)):
                best_g.add_metric([self.run_id, str(best["point"])], float(best[column]))
            yield best_g
            each = GaugeMetricFamily(f"emulator_sweep_point_{suffix}", doc, labels=["run", "point"])
            for r in rows:
                if r.get("status") == "ok" and _finite(r.get(column)):
                    each.add_metric([self.run_id, str(r["point"])], float(r[column]))
            yield each


def _finite(value) -> bool:
    try:
        return value not in (None, "") and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class SweepMetrics:
    """``update(rows, total, eta_s, best)`` as points finish; ``close()`` at the end."""

    def __init__(self, run_id: str, sweep_file: str, port: int, host: str = "127.0.0.1") -> None:
        self.collector = SweepCollector(run_id, sweep_file)
        self.exporter = Exporter(self.collector, port, host)

    def update(self, rows: list[dict], total: int, eta_s: float, best: dict | None) -> None:
        self.exporter.publish((list(rows), total, eta_s, best))

    def close(self) -> None:
        self.exporter.close()

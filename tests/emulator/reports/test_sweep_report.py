"""The report of a sweep directory: the Pareto front of memory against iteration time, the page."""

from __future__ import annotations

from emulator.cli import main
from emulator.reports.sweep_report import pareto_front
from emulator.studies.sweep import write_sweep_csv

GiB = 2**30


def _row(point: int, time_s: float | None, memory_gib: float | None, status: str = "ok", **knobs) -> dict:
    return {"point": point, "config_hash": f"h{point}", **knobs, "status": status,
            "reason": "" if status == "ok" else f"{status} reason", "iteration_time_s": time_s,
            "tokens_per_s": 1000 / time_s if time_s else None,
            "peak_memory_bytes": memory_gib * GiB if memory_gib is not None else None}  # fmt: skip


def test_pareto_front_keeps_the_points_nothing_beats_on_both():
    rows = [_row(0, 2.0, 10), _row(1, 1.0, 30), _row(2, 1.5, 12), _row(3, 1.5, 20), _row(4, 3.0, 10),
            _row(5, 1.2, 12), _row(6, None, None, status="oom"), _row(7, 0.5, 1, status="timeout")]  # fmt: skip
    # 3 is beaten by 2 (same time, less memory), 4 and 0 by 2 or 5 ... except 0 (least memory, 10)
    # 2 is beaten by 5 (faster, same memory); failed points never count
    assert [r["point"] for r in pareto_front(rows)] == [1, 5, 0]


def test_report_of_a_sweep_directory(tmp_path, capsys):
    rows = [_row(0, 2.0, 10, mbs=1), _row(1, 1.0, 30, mbs=2), _row(2, 1.5, 40, mbs=4),
            _row(3, None, None, status="oom", mbs=8)]  # fmt: skip
    write_sweep_csv(tmp_path / "sweep.csv", ["mbs"], rows)
    assert main(["report", str(tmp_path)]) == 0
    assert "2 plots" in capsys.readouterr().out
    page = (tmp_path / "report.html").read_text()
    assert page.count("<h2>") == 3 and "4 points, 3 ok" in page
    assert "oom reason" in page and "10.00 GiB" in page
    flagged = [row for row in page.split("<tr>") if "<td>yes</td>" in row]
    assert len(flagged) == 2 and all(">2 s<" in r or ">1 s<" in r for r in flagged)
    assert (tmp_path / "report-pareto.png").stat().st_size > 1000
